"""The config rules' old import path: benchmarks/served_grid.py still imports it; the rules live in optimizer/triton/rules/."""

from optimizer.triton.rules import check, facts_for

__all__ = ["check", "facts_for"]
