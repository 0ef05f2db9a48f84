"""Measurement tasks: correctness against the reference, profiling, max-batch search, and process isolation."""
