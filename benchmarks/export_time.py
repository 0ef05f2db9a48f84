"""Export time: how long the bundled transformer's default export takes with this checkout against another revision.

Both revisions export the same model with the same flags (no artifact cache), interleaved (theirs, ours, theirs, ours,
...) so the machine's drift hits both; the other revision runs from a git worktree of REF. The ratio is the median of
ours over the median of theirs.

    .venv/bin/python benchmarks/export_time.py --against REF [--runs 3]

The last line is machine-readable, and the figures go to benchmarks/results/export_time.json:
    export_time ours=<s> theirs=<s> ratio=<ours/theirs> runs=<n> against=<REF>
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

ARGS = ["--input", "input_ids:int64:1-128", "--value-range", "input_ids:0:999", "--no-cache"]


def one_export(checkout: Path, work: Path) -> float:
    """Seconds of one export of the bundled transformer from `checkout`'s code (fails loudly)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cli = Path(sys.executable).parent / "aitune-export"
    t0 = time.monotonic()
    run = subprocess.run([str(cli), "export", str(checkout / "optimizer" / "examples" / "transformer.py") + ":build", *ARGS,
                          "--repository", str(work / "repo"), "--report-dir", str(work / "report"), "--cache-dir", str(work.parent / f"cache-{checkout.name}")],
                         cwd=work, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(checkout)))
    took = time.monotonic() - t0
    if run.returncode != 0:
        raise SystemExit(f"the export from {checkout} failed: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", required=True, help="the git revision to compare with (a tag, a branch or a commit)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="aitune-export-time-"))
    theirs_dir = scratch / "theirs"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(theirs_dir), args.against], check=True, capture_output=True)
    ours, theirs = [], []
    try:
        for i in range(args.runs):
            theirs.append(one_export(theirs_dir, scratch / "work"))
            ours.append(one_export(ROOT, scratch / "work"))
            print(f"run {i + 1}: theirs {theirs[-1]:.1f} s, ours {ours[-1]:.1f} s", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(theirs_dir)], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    ratio = statistics.median(ours) / statistics.median(theirs)
    line = (f"export_time ours={statistics.median(ours):.1f} theirs={statistics.median(theirs):.1f} ratio={ratio:.3f} runs={args.runs} "
            f"against={args.against}")
    from results import write_result

    write_result("export_time", {"settings": {"runs": args.runs, "against": args.against, "model": "optimizer.examples.transformer:build",
                                              "flags": " ".join(ARGS), "order": "interleaved, theirs first"},
                                 "ours_s": [round(x, 1) for x in ours], "theirs_s": [round(x, 1) for x in theirs],
                                 "ours_median_s": round(statistics.median(ours), 1), "theirs_median_s": round(statistics.median(theirs), 1),
                                 "ratio": round(ratio, 3)})
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
