"""Use cases: turn settings into one checked plan, then export, inspect or republish (cli.py calls these)."""
