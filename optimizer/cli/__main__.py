"""`python -m optimizer.cli`: the console script, for a child process that must use this interpreter."""

from optimizer.cli import run

if __name__ == "__main__":
    run()
