"""PLACEHOLDER: per_head_l2_norm (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("per_head_l2_norm")


def make_per_head_l2_norm(cfg, **flags):
    raise NotImplementedError("per_head_l2_norm")
