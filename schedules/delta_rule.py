"""PLACEHOLDER: delta_rule schedules (being written)."""


def llvm(sch, cfg, **flags):
    raise NotImplementedError("delta_rule")


def cuda(sch, cfg, **flags):
    raise NotImplementedError("delta_rule")
