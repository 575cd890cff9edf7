"""PLACEHOLDER: gated_rmsnorm (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("gated_rmsnorm")


def make_gated_rmsnorm(cfg, **flags):
    raise NotImplementedError("gated_rmsnorm")
