"""Hand schedules, one module per op: `llvm(sch, cfg, **flags)` and `cuda(sch, cfg, **flags, **knobs)`.

The registry imports each module by its op family name; a module's `KNOBS` is its CUDA knob grid.
"""
