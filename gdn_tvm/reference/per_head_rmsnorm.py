"""PLACEHOLDER: per_head_rmsnorm reference (being written)."""


def per_head_rmsnorm(**kwargs):
    raise NotImplementedError("per_head_rmsnorm")

