"""Code generation: schedule application, compilation for llvm or CUDA, and shared-library export. Below both
tuning (which compiles candidates) and export (which compiles records)."""
