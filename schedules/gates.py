"""PLACEHOLDER: gates schedules (being written)."""


def llvm(sch, cfg, **flags):
    raise NotImplementedError("gates")


def cuda(sch, cfg, **flags):
    raise NotImplementedError("gates")
