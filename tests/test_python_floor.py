"""The Python the package says it needs is the Python its code needs: pyproject's requires-python floor is at least
what vermin (which reads every module for the standard-library names and syntax each Python version added) finds."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _floor() -> tuple[int, int]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    found = re.fullmatch(r">=\s*3\.(\d+)", spec.strip())
    assert found, f"requires-python {spec!r} is not '>=3.N': say the floor as one version"
    return 3, int(found.group(1))


def test_the_declared_python_floor_holds_the_code():
    vermin = shutil.which("vermin", path=str(Path(sys.executable).parent)) or shutil.which("vermin")
    if vermin is None:
        pytest.skip("vermin is not installed: pip install -e '.[test]'")
    done = subprocess.run([vermin, "--no-tips", "--no-parse-comments", "--violations", f"-t={'.'.join(map(str, _floor()))}",
                           str(ROOT / "optimizer")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (f"the code needs a newer Python than requires-python says ({'.'.join(map(str, _floor()))}); "
                                  f"raise the floor in pyproject.toml or avoid the newer names:\n{done.stdout}{done.stderr}")


def test_the_tests_run_on_a_python_the_package_accepts():
    assert sys.version_info[:2] >= _floor()
