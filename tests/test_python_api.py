"""The Python API as users call it: from a notebook (no file behind __main__) and from a script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _python(code_or_file: str | Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(cwd / ".cache"))
    target = [str(code_or_file)] if isinstance(code_or_file, Path) else ["-c", code_or_file]
    return subprocess.run([sys.executable, *target, *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_a_module_defined_in_a_notebook_is_tuned_and_published(tmp_path: Path):
    # a notebook's class lives in a __main__ with no file: the measuring processes cannot import it, so it must reach them by value
    r = _python(textwrap.dedent("""
        import torch, optimizer

        class Scaled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 3)

            def forward(self, x):
                return self.fc(x) * 2

        torch.manual_seed(0)
        try:
            optimizer.export(module=Scaled(), example_inputs=(torch.randn(1, 4),), backends=["onnxruntime"])
        except optimizer.SettingsError as err:
            print("refused:", err)
        # the options as keywords (the CLI's long names), over settings; a string for a repeatable one
        settings = optimizer.ExportSettings(serve_search="off", precision="fp32")
        out = optimizer.export(settings, module=Scaled(), example_inputs=(torch.randn(1, 4),), backend="onnxruntime", max_batch_size=2)
        print("published", out.published.model_dir, out.published.config["max_batch_size"])
    """), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: unknown setting(s) backends (did you mean backend?)" in r.stdout
    assert (tmp_path / "model_repository" / "scaled" / "1" / "model.onnx").exists() and r.stdout.strip().endswith(" 2")
    assert "Can't get attribute" not in r.stderr


SCRIPT = """
import optimizer
from optimizer.task.isolation import refuse_unguarded_main

def main():
    refuse_unguarded_main()
    print("allowed")

{call}
"""


@pytest.mark.parametrize("call,allowed", [
    ("main()", False),
    ('if __name__ == "__main__":\n    main()', True),
    ('if "__main__" == __name__:\n    main()', True),
    ('if __name__ == "__main__":\n    pass\nmain()', False),
])
def test_a_script_may_start_the_export_only_under_its_main_guard(tmp_path: Path, call: str, allowed: bool):
    script = tmp_path / "tune.py"
    script.write_text(SCRIPT.format(call=call))
    r = _python(script, tmp_path)
    if allowed:
        assert r.returncode == 0 and "allowed" in r.stdout, r.stderr
    else:
        assert r.returncode != 0 and "allowed" not in r.stdout
        assert 'outside `if __name__ == "__main__":`' in r.stderr and "tune.py (line " in r.stderr


def test_an_unguarded_script_is_refused_before_anything_is_written(tmp_path: Path):
    # without the guard, every measuring process would run the script's export again and die: refused first, in one line
    script = tmp_path / "export_it.py"
    script.write_text("import optimizer\n\noptimizer.export(optimizer.ExportSettings(serve_search='off'))\n")
    r = _python(script, tmp_path)
    assert r.returncode != 0
    assert "UsageError: the export is started at the top level of export_it.py (line 3)" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".cache") == ["export_it.py"]
