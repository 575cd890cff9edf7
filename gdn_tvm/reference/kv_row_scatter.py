"""PLACEHOLDER: kv_row_scatter reference (being written)."""


def kv_row_scatter(**kwargs):
    raise NotImplementedError("kv_row_scatter")

