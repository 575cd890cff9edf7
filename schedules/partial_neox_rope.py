"""PLACEHOLDER: partial_neox_rope schedules (being written)."""


def llvm(sch, cfg, **flags):
    raise NotImplementedError("partial_neox_rope")


def cuda(sch, cfg, **flags):
    raise NotImplementedError("partial_neox_rope")
