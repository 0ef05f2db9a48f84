"""A second identical export must reuse builds and measurements: time both runs side by side.

Usage: .venv/bin/python benchmarks/cache_speedup.py [MODEL]
Ends with: cache_speedup first=<s> second=<s> ratio=<r>
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from optimizer.export import export
from optimizer.settings import ExportSettings


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory(prefix="cache_speedup-") as tmp:
        root = Path(tmp)
        times = []
        for run in range(2):
            settings = ExportSettings(model=model, repository=str(root / "repo"), report_dir=str(root / "report"),
                                      cache_dir=str(root / "cache"), overwrite=True)
            t0 = time.perf_counter()
            outcome = export(settings)
            times.append(time.perf_counter() - t0)
            reused = {c.name: c.cached or "-" for c in outcome.result.candidates}
            print(f"run {run + 1}: {times[-1]:.1f} s, selected {outcome.result.selected}, reused: {reused}")
    print(f"cache_speedup first={times[0]:.1f} second={times[1]:.1f} ratio={times[0] / times[1]:.1f}")


if __name__ == "__main__":
    main()
