"""Triton's own tools, run for real: the bundled tritonserver (and the stand-in backends it runs where the native one
is missing), perf_analyzer and its input data, and a user's running server (--url)."""
