"""PLACEHOLDER: gemv schedules (being written)."""


def llvm(sch, cfg, **flags):
    raise NotImplementedError("gemv")


def cuda(sch, cfg, **flags):
    raise NotImplementedError("gemv")
