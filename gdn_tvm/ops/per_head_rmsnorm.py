"""PLACEHOLDER: per_head_rmsnorm (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("per_head_rmsnorm")


def make_per_head_rmsnorm(cfg, **flags):
    raise NotImplementedError("per_head_rmsnorm")
