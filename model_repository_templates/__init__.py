"""Jinja2 templates of config.pbtxt, one per Triton platform, with shared partials (shipped in the package)."""
