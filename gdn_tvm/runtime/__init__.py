"""The executor side: load built modules, bind launch plans, run decode steps (needs the TVM runtime only)."""
