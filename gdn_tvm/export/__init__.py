"""`make build`: apply the tuning records strictly, compile, and export a shared library with its manifest."""
