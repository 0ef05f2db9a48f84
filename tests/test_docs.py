"""The documentation site: it builds with `mkdocs build --strict` (a broken link or anchor fails it), and the user
documentation speaks to users: no development-round wording, no file that is not in the repository."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ROUND_WORDING = re.compile(r"this[ ]stop|last[ ]stop|stop[ ]before|earlier[ ](runs|stop)", re.IGNORECASE)  # [ ]: the pattern does not match itself
OUTSIDE_FILES = ("DESIGN.md", "reference/triton")


def _documentation() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").rglob("*") if p.is_file())
    return [*docs, ROOT / "README.md", ROOT / "CHANGELOG.md"]


def test_documentation_names_no_development_round_and_no_file_outside_the_repository():
    offending = []
    for path in _documentation():
        if not path.exists():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if ROUND_WORDING.search(line) or any(name in line for name in OUTSIDE_FILES):
                offending.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:160]}")
    assert not offending, "write for users, in the present tense, citing only files in the repository:\n" + "\n".join(offending)


@pytest.mark.slow
def test_mkdocs_build_strict_passes(tmp_path: Path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' (make docs installs it)")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    cli = (site / "cli" / "index.html").read_text()
    assert "aitune-export export" in cli and "--max-batch-size" in cli, "the CLI reference was not generated from the click commands"
    api = (site / "api" / "index.html").read_text()
    assert "ExportSettings" in api and "NoCandidateError" in api, "the API page was not generated from the docstrings"


def test_the_version_moves_with_the_changelog():
    """The package version, pyproject's and the newest release in CHANGELOG.md are one version."""
    import re
    import tomllib

    from optimizer._version import __version__

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert __version__ == pyproject == releases[0], (__version__, pyproject, releases[:1])
