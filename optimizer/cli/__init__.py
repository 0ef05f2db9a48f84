"""The command line: the click commands (commands.py) and the lines they print (output.py).

`main` is the click group and `run` the console script (pyproject.toml's `aitune-export`).
"""

from optimizer.cli.commands import main, run

__all__ = ["main", "run"]
