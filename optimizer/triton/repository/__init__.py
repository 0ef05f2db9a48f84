"""Publishing into a Triton model repository: atomic placement in a folder or object storage, the Model Analyzer config
beside the report, and reading a published export back (exports.py)."""
