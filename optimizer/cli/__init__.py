"""The command line: the click commands (commands.py; serve and traffic in serving_commands.py) and the lines they print (output.py).

`main` is the click group and `run` the console script (pyproject.toml's `aitune-export`).
"""

from optimizer.cli.commands import main, run
from optimizer.cli import serving_commands  # noqa: F401  (registers serve and traffic on main)

__all__ = ["main", "run"]
