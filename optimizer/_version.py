"""The package version, in one place (the CLI, the report and the cache key read it)."""

__version__ = "0.2.0"
