"""What the user asked of the served search: the load, the latency budget, the time, the server it runs on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from optimizer.triton.measure.served_search.objective import Objective
from optimizer.triton.runtime.perf_analyzer import LOCAL_PROTOCOL


@dataclass(frozen=True)
class SearchRequest:
    """What the user asked of the search: the load, the latency budget, the time it may take, where it works."""

    workdir: Path
    concurrency: int | None = None  # None: no fixed load (a range, a latency budget, or any load)
    latency_budget_ms: float | None = None
    percentile: int = 95
    budget_s: float = 90.0
    cache_dir: Path | None = None
    user_max: int | None = None  # --max-batch-size: never changed by the search
    wait_for_cores_s: float = 0.0  # --wait-for-cores: how long to wait for cores other processes keep busy
    url: str | None = None  # --url: a running Triton (explicit model control) to search on instead of the bundled one
    protocol: str = LOCAL_PROTOCOL  # how the variants are loaded and measured: --protocol with --url, else LOCAL_PROTOCOL
    server_version: str = ""  # what that server said it is (remote.probe_server)
    use_cache: bool = True  # --cache: reuse the search of an identical earlier run (cache.py)
    load_range: tuple[int, int] | None = None  # --concurrency LOW:HIGH: every load of that range counts
    rate: float | None = None  # --rate R: the requests per second the config must hold (open-loop)
    rate_max: bool = False  # --rate max: the highest rate held within the latency budget
    arrivals: str = "poisson"  # --arrivals: how open-loop requests arrive (a trace keeps its own schedule)
    headroom: float = 0.2  # --headroom: the share of a replica's capacity kept free when R becomes replicas

    @property
    def rate_objective(self) -> bool:
        """Whether the published config is chosen open-loop (--rate R or max); a latency budget alone only states its capacity."""
        return self.rate is not None or self.rate_max

    @property
    def open_loop(self) -> bool:
        """Whether anything is measured open-loop: a rate objective, or the capacity of the config chosen within a budget."""
        return self.rate_objective or self.latency_budget_ms is not None

    @property
    def objective(self) -> Objective:
        return Objective(self.concurrency, self.latency_budget_ms, self.percentile, self.load_range)
