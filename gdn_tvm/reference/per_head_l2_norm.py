"""PLACEHOLDER: per_head_l2_norm reference (being written)."""


def per_head_l2_norm(**kwargs):
    raise NotImplementedError("per_head_l2_norm")

