"""PLACEHOLDER: split_interleaved (being written)."""


def signature(cfg, **flags):
    raise NotImplementedError("split_interleaved")


def make_split_interleaved(cfg, **flags):
    raise NotImplementedError("split_interleaved")
