"""PLACEHOLDER: gates (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("gates")


def make_gates(cfg, **flags):
    raise NotImplementedError("gates")
