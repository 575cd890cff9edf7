"""PLACEHOLDER: kv_row_scatter (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("kv_row_scatter")


def make_kv_row_scatter(cfg, **flags):
    raise NotImplementedError("kv_row_scatter")
