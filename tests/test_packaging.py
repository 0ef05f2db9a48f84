"""The package list in pyproject.toml is written by hand (one package is mapped from the root): keep it complete."""

from __future__ import annotations

import tomllib

from tests.conftest import ROOT


def test_every_subpackage_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "optimizer").rglob("__init__.py")}
    found.add("optimizer.model_repository_templates")
    assert found == listed


def test_templates_ship_with_the_package():
    from optimizer.triton.config.model_config import packaged_template_dir

    names = {p.name for p in packaged_template_dir().glob("*.pbtxt.j2")}
    assert {"onnxruntime_onnx.pbtxt.j2", "pytorch_libtorch.pbtxt.j2", "torch_aoti.pbtxt.j2", "tensorrt_plan.pbtxt.j2", "openvino.pbtxt.j2"} <= names
