"""PLACEHOLDER: partial_neox_rope reference (being written)."""


def partial_neox_rope(**kwargs):
    raise NotImplementedError("partial_neox_rope")

