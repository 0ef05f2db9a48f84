"""Bundled example models: `cnn` is the default MODEL, `transformer` exercises int64 ids and a dynamic sequence."""
