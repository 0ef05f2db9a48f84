"""Decide the served operating point in the server: config variants of the chosen artifact, measured by perf_analyzer."""

from optimizer.triton.measure.served_search.search import SearchRequest, served_search

__all__ = ["SearchRequest", "served_search"]
