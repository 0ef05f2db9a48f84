"""A second identical export must reuse builds and measurements: time both runs side by side.

Each run is a fresh `aitune-export export` process, as a user (or CI) would start it, so the second
one pays Python start-up, the torch import and loading the model, and only those.

Usage: .venv/bin/python benchmarks/cache_speedup.py [MODEL]
Ends with: cache_speedup first=<s> second=<s> ratio=<r>
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    model = sys.argv[1:2]
    with tempfile.TemporaryDirectory(prefix="cache_speedup-") as tmp:
        root = Path(tmp)
        times = []
        for run in range(2):
            cmd = [sys.executable, "-m", "optimizer.cli", "-q", "export", *model, "--repository", str(root / "repo"),
                   "--report-dir", str(root / "report"), "--cache-dir", str(root / "cache"), "--overwrite"]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - t0)
            result = json.loads((root / "report" / "report.json").read_text())["result"]
            reused = {c["name"]: c["cached"] or "-" for c in result["candidates"]}
            print(f"run {run + 1}: {times[-1]:.1f} s, selected {result['selected']}, reused: {reused}")
    print(f"cache_speedup first={times[0]:.1f} second={times[1]:.1f} ratio={times[0] / times[1]:.1f}")


if __name__ == "__main__":
    main()
