"""PLACEHOLDER: split_interleaved schedules (being written)."""


def llvm(sch, cfg, **flags):
    raise NotImplementedError("split_interleaved")


def cuda(sch, cfg, **flags):
    raise NotImplementedError("split_interleaved")
