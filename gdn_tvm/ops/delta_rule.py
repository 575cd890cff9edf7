"""PLACEHOLDER: delta_rule (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("delta_rule")


def make_delta_rule(cfg, **flags):
    raise NotImplementedError("delta_rule")
