"""The served search's cache: a re-run of the same export republishes the variants it measured without measuring again.

The key is everything the measurements depend on: the search's own source (a development checkout does not bump the
version, and a changed search must not republish the old one's choice), the artifact's files, the config the variants
are rendered from (the rules' start, the platform's settings, the client contract), the in-process decision's space
(its peak and the largest batch that fit: a wider space is a different search), the request mix, the load and budget asked for,
the server build (the bundled server's home, named by its version and stand-in sources; or a --url server's address
and version), the target release and the machine. A search measured beside other processes' load is never
stored (as in-process measurements on fewer cores are not): a quiet re-run measures again. An entry is written aside and renamed into place; one
that cannot be read is ignored with a warning, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from optimizer.machine import machine_fingerprint
from optimizer.records.served_search import ServedSearch
from optimizer.records.tune_result import TuneResult

log = logging.getLogger(__name__)

CACHE_FORMAT = 2
"""2: measured under the run's traffic, from a lone client up, with another kind's candidate and the padding trial."""


def search_key(result: TuneResult, start_config: str, request: Any, server_build: str, io_names: str, others: tuple[str, ...] = ()) -> str:
    """The cache key of one served search (see the module docstring for what goes in)."""
    from optimizer._version import __version__
    from optimizer.triton.repository.publish import model_files

    h = hashlib.sha256(f"aitune-export {__version__} served-search {CACHE_FORMAT}".encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):  # the search's own code: a changed search measures again
        _hash_file(h, source)
    for target, source in sorted(model_files(result).items()):
        h.update(target.encode() + b"\0")
        _hash_file(h, source)
    h.update(start_config.encode())
    decision = result.selected_candidate.decision  # the space beside the start: the peak, the largest batch that fit
    if decision is not None:
        h.update(json.dumps([decision.peak, decision.largest_fit, decision.measured_max, decision.decided_by]).encode())
    _hash_file(h, Path(result.reference.profile_feed))
    if result.reference.traffic:  # the requests every variant is measured with, and a trace's schedule
        _hash_file(h, Path(result.reference.traffic))
        from optimizer.model.traffic import timestamps_path

        if (stamps := timestamps_path(result.reference.traffic)).is_file():
            _hash_file(h, stamps)
    for other in others:  # another kind's candidate that enters the search: its files and its space too
        cand = next(c for c in result.candidates if c.name == other)
        h.update(other.encode() + b"\0")
        for target, source in sorted(model_files(replace(result, selected=other)).items()):
            h.update(target.encode() + b"\0")
            _hash_file(h, source)
        if cand.decision is not None:
            h.update(json.dumps([cand.decision.peak, cand.decision.largest_fit, cand.decision.max_batch_size]).encode())
    settings = {"concurrency": request.concurrency, "load_range": request.load_range, "latency_budget_ms": request.latency_budget_ms, "percentile": request.percentile,
                "budget_s": request.budget_s, "user_max": request.user_max, "url": request.url, "protocol": request.protocol,
                "server_version": request.server_version, "io_names": io_names, "release": result.triton_release,
                "server": server_build, "machine": machine_fingerprint(), "rate": request.rate, "rate_max": request.rate_max,
                "arrivals": request.arrivals, "headroom": request.headroom}
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]


class ServedSearchCache:
    """Served searches by key under <cache root>/served_search/."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root) / "served_search"

    def load(self, key: str) -> ServedSearch | None:
        """The stored search, marked with when it was measured; None when there is none or it cannot be trusted."""
        path = self.root / f"{key}.json"
        if not path.is_file():
            return None
        try:
            doc = json.loads(path.read_text())
            search = ServedSearch.from_json(doc["search"])
            if search.status != "searched" or search.chosen is None or search.chosen_variant is None:
                raise ValueError("it holds no measured choice")
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("ignoring the served-search cache entry %s: %s", path, err)
            return None
        search.cached_from = str(doc.get("measured_at") or "")
        return search

    def store(self, key: str, search: ServedSearch) -> None:
        """Keep a finished search (never one measured beside other processes' load, nor a skipped one)."""
        if search.status != "searched" or search.beside_load or search.cached_from:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        doc = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "search": search.to_json()}
        with tempfile.NamedTemporaryFile("w", dir=self.root, prefix=f".{key}.", delete=False) as tmp:
            json.dump(doc, tmp)
        os.replace(tmp.name, self.root / f"{key}.json")


def _hash_file(h: Any, path: Path) -> None:
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
