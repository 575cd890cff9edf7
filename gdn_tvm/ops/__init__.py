"""TensorIR definitions, one module per op: `make_<op>(cfg, **flags)` and `signature(cfg, **flags)`.

The registry (`gdn_tvm/registry.py`) imports each module by its op family name.
"""
