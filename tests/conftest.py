"""Shared fixtures: small models written for the tests, and a way to run the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
CLI = [sys.executable, "-m", "optimizer.cli"]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None,
            serve_search: bool = False) -> subprocess.CompletedProcess:
    """Run `aitune-export ARGS` as a user would (a real process); returns the completed process.

    An export skips the served search (adds --serve-search off) unless the test asks for it with `serve_search=True`
    or names the flag itself: each search starts a server and measures for up to 25 s, and tests/test_served_search.py
    and the quick-start test cover it.
    """
    if args and args[0] == "export" and not serve_search and not any(a.startswith("--serve-search") for a in args):
        args = (*args, "--serve-search", "off")
    # each test gets its own artifact cache (beside its working directory), so no test reuses another's builds
    cache = str((cwd or ROOT / ".pytest_cache") / ".cache")
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=cache, **(env or {}))
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test inside an empty directory (reports and repositories land there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    return tmp_path


def tree_snapshot(path: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, mtime_ns) of every file under path: compare before/after to prove nothing changed."""
    if not path.exists():
        return {}
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(path).parts
    }
