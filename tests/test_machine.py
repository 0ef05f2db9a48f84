"""One cache root: --cache-dir, else $AITUNE_EXPORT_CACHE_DIR, else $XDG_CACHE_HOME/aitune-export; every cache lives below it."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.backend import backend_named
from optimizer.errors import SettingsError
from optimizer.machine import CACHE_DIR_ENV, cache_root
from optimizer.triton.runtime.install import homes_root
from optimizer.vocab import Device


def test_cache_root_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "aitune-export"
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(str(tmp_path / "flag")) == tmp_path / "flag"  # --cache-dir wins over both


def test_every_cache_lives_under_the_run_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "env"))
    assert homes_root() == tmp_path / "env" / "tritonserver"  # the local tritonserver's home
    assert homes_root(tmp_path / "flag") == tmp_path / "flag" / "tritonserver"
    for name in ("tensorrt", "onnxruntime-trt"):  # the TensorRT timing caches
        b = backend_named(name)
        run = b.for_run("fp32", tmp_path / "flag")
        assert run.settings["cache_dir"] == str(tmp_path / "flag" / "tensorrt")
        assert run.cache_key() == b.cache_key(), "where a cache lives changes no artifact"
        mine = backend_named(name, cache_dir=str(tmp_path / "mine")).for_run("fp32", tmp_path / "flag")
        assert mine.settings["cache_dir"] == str(tmp_path / "mine"), "a backend setting the user gave is kept"
    assert backend_named("onnxruntime").for_run("fp32", tmp_path / "flag").settings.get("cache_dir") is None


def test_device_is_parsed_once_into_a_value():
    assert Device.parse("cpu") == Device("cpu") and str(Device.parse("cuda:1")) == "cuda:1"
    assert Device.parse("cuda").cuda_index == 0 and str(Device.parse("cuda")) == "cuda"
    assert Device.of(Device("cuda", 2)) == Device("cuda", 2)
    for bad in ("gpu", "cpu:1", "cuda:x", ""):
        with pytest.raises(SettingsError, match="is not cpu or cuda"):
            Device.parse(bad)
