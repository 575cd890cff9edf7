"""PLACEHOLDER: per_head_l2_norm schedules (being written)."""


def llvm(sch, cfg, **flags):
    raise NotImplementedError("per_head_l2_norm")


def cuda(sch, cfg, **flags):
    raise NotImplementedError("per_head_l2_norm")
