"""PLACEHOLDER: delta_rule reference (being written)."""


def delta_rule(**kwargs):
    raise NotImplementedError("delta_rule")

