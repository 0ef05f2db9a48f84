"""A second identical export must reuse builds, measurements and the served search: time both runs side by side.

Each run is a fresh `aitune-export export` process, as a user (or CI) would start it, so the second
one pays Python start-up, the torch import and loading the model, and only those. The published files of
both runs are compared byte for byte (a reused search must publish what the measured one did).

Usage: .venv/bin/python benchmarks/cache_speedup.py [MODEL]
Ends with: cache_speedup first=<s> second=<s> ratio=<r> same_bytes=<yes|no> served_search_reused=<yes|no>
and writes benchmarks/results/cache_speedup.json (results.py), the figures under the model (MODEL as given; cnn, the
bundled example, without one).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results: the benchmarks' records

from results import line_figures, merge_models, write_result  # noqa: E402


def main() -> None:
    model = sys.argv[1:2]
    with tempfile.TemporaryDirectory(prefix="cache_speedup-") as tmp:
        root = Path(tmp)
        times, published = [], []
        for run in range(2):
            cmd = [sys.executable, "-m", "optimizer.cli", "-q", "export", *model, "--repository", str(root / "repo"),
                   "--report-dir", str(root / "report"), "--cache-dir", str(root / "cache"), "--overwrite"]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - t0)
            result = json.loads((root / "report" / "report.json").read_text())["result"]
            reused = {c["name"]: c["cached"] or "-" for c in result["candidates"]}
            search = json.loads((root / "report" / "report.json").read_text())["published"].get("served_search") or {}
            published.append({str(p.relative_to(root / "repo")): hashlib.sha256(p.read_bytes()).hexdigest()
                              for p in sorted((root / "repo").rglob("*")) if p.is_file()})
            print(f"run {run + 1}: {times[-1]:.1f} s, selected {result['selected']}, reused: {reused}, "
                  f"served search {search.get('status')}{' (reused from ' + search['cached_from'] + ')' if search.get('cached_from') else ''}")
    same = "yes" if published[0] == published[1] else "no"
    line = (f"cache_speedup first={times[0]:.1f} second={times[1]:.1f} ratio={times[0] / times[1]:.1f} same_bytes={same} "
            f"served_search_reused={'yes' if search.get('cached_from') else 'no'}")
    print(line)
    write_result("cache_speedup", merge_models("cache_speedup", {model[0] if model else "cnn": {**line_figures(line), "selected": result["selected"]}},
                                               {"settings": {"runs": 2, "timed": "each run a fresh process, start to exit"}}))


if __name__ == "__main__":
    main()
