"""PLACEHOLDER: gemv reference (being written)."""


def gemv(**kwargs):
    raise NotImplementedError("gemv")

