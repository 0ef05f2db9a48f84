"""config.pbtxt: a spec from the tuning result, rendered by the platform's Jinja2 template, parsed into Triton's
ModelConfig, checked against Triton's load-time rules, and the ensemble that keeps the client contract."""
