"""float64 numpy references with the kernels' signatures and in-place state semantics.

The registry imports each module by its op family name; `decode_step` holds whole mixer steps.
"""
