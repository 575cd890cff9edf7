"""PLACEHOLDER: kv_row_scatter schedules (being written)."""


def llvm(sch, cfg, **flags):
    raise NotImplementedError("kv_row_scatter")


def cuda(sch, cfg, **flags):
    raise NotImplementedError("kv_row_scatter")
