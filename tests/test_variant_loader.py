"""The served search's variant loader: what it asks of the repository API and when it waits (a made-up server whose
unloads take a few index polls to finish, as the python backend's do)."""

from __future__ import annotations

import pytest

from optimizer.errors import ValidationError
from optimizer.triton.runtime import server as server_module
from optimizer.triton.measure.served_search.loader import VariantLoader

MODEL_CONFIG = 'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 4\n'


class _Server:
    """Models go READY on load; an unloaded one stays UNLOADING for `polls` index reads (None: for ever)."""

    def __init__(self, polls: int | None = 3) -> None:
        self.states: dict[str, str] = {}
        self.countdown: dict[str, int] = {}
        self.polls = polls
        self.events: list[str] = []

    def client(self, *args, **kwargs) -> "_Client":
        return _Client(self)


class _Client:
    def __init__(self, server: _Server) -> None:
        self.server = server

    def load_model(self, name: str, config: str, files=None) -> None:
        unloading = sorted(n for n, s in self.server.states.items() if s == "UNLOADING")
        self.server.events.append(f"load {name} while {','.join(unloading) or 'nothing'} unloading")
        self.server.states[name] = "READY"

    def unload_model(self, name: str) -> None:
        self.server.events.append(f"unload {name}")
        self.server.states[name] = "UNLOADING"
        if self.server.polls is not None:
            self.server.countdown[name] = self.server.polls

    def get_model_repository_index(self) -> list[dict[str, str]]:
        for name, left in list(self.server.countdown.items()):
            if left <= 0:
                self.server.states[name] = "UNAVAILABLE"
                del self.server.countdown[name]
            else:
                self.server.countdown[name] = left - 1
        self.server.events.append("index")
        return [{"name": n, "state": s} for n, s in self.server.states.items()]

    def close(self) -> None:
        pass


@pytest.fixture
def fake(monkeypatch):
    server = _Server()
    monkeypatch.setattr(server_module, "open_client", server.client)
    return server


def test_an_unload_left_unwaited_overlaps_the_next_load_which_waits_for_it_before_returning(fake):
    with VariantLoader("127.0.0.1:1", parallel=1) as loader:
        assert loader.load({"m__aitune_1": MODEL_CONFIG, "m__aitune_2": MODEL_CONFIG}) == {}
        loader.unload(["m__aitune_1", "m__aitune_2"], wait=False)
        assert fake.events[-1] == "unload m__aitune_2"  # returned at once, no index read
        loader.load({"m__aitune_3": MODEL_CONFIG})
        # the new variant loaded while the old ones were still going, and load() returned only once they were gone
        assert "load m__aitune_3 while m__aitune_1,m__aitune_2 unloading" in fake.events
        assert fake.states["m__aitune_1"] == fake.states["m__aitune_2"] == "UNAVAILABLE"
        assert fake.states["m__aitune_3"] == "READY"
    assert fake.states["m__aitune_3"] == "UNAVAILABLE"  # closing unloads and waits for what is left


def test_a_waited_unload_returns_only_once_the_server_let_the_variants_go(fake):
    with VariantLoader("127.0.0.1:1") as loader:
        loader.load({"m__aitune_1": MODEL_CONFIG})
        loader.unload(["m__aitune_1"])
        assert fake.states["m__aitune_1"] == "UNAVAILABLE"


def test_a_variant_the_server_never_lets_go_is_named_when_the_next_load_gives_up_waiting(monkeypatch):
    server = _Server(polls=None)
    monkeypatch.setattr(server_module, "open_client", server.client)
    loader = VariantLoader("127.0.0.1:1", timeout_s=0.2)
    loader.load({"m__aitune_1": MODEL_CONFIG})
    loader.unload(["m__aitune_1"], wait=False)
    with pytest.raises(ValidationError, match="did not unload m__aitune_1 within"):
        loader.load({"m__aitune_2": MODEL_CONFIG})
