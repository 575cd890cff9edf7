"""PLACEHOLDER: gemv (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("gemv")


def make_gemv(cfg, **flags):
    raise NotImplementedError("gemv")
