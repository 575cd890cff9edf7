"""PLACEHOLDER: partial_neox_rope (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("partial_neox_rope")


def make_partial_neox_rope(cfg, **flags):
    raise NotImplementedError("partial_neox_rope")
