"""Export time: how long the bundled transformer's export takes with this checkout against another revision, or with
some flags against the same checkout's default export.

Both sides export the same model (no artifact cache), interleaved (theirs, ours, theirs, ours, ...) so the machine's
drift hits both. With --against REF the other side runs from a git worktree of REF; with --flags "..." ours adds those
flags (e.g. "--rate max --latency-budget-ms 20": what asking for a rate costs). The ratio is the median of ours over
the median of theirs.

    .venv/bin/python benchmarks/export_time.py --against REF [--runs 3]
    .venv/bin/python benchmarks/export_time.py --flags "--rate max --latency-budget-ms 20" [--runs 3]

The last line is machine-readable, and the figures go to benchmarks/results/export_time.json (one entry per
comparison: "against REF" or the flags):
    export_time ours=<s> theirs=<s> ratio=<ours/theirs> runs=<n> against=<REF or HEAD> flags=<FLAGS or none>
"""

from __future__ import annotations

import argparse
import os
import shlex
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


def one_export(checkout: Path, work: Path, flags: list[str] = ()) -> float:
    """Seconds of one export of the bundled transformer from `checkout`'s code, with `flags` added (fails loudly)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cli = Path(sys.executable).parent / "aitune-export"
    t0 = time.monotonic()
    run = subprocess.run([str(cli), "export", str(checkout / "optimizer" / "examples" / "transformer.py") + ":build", *ARGS, *flags,
                          "--repository", str(work / "repo"), "--report-dir", str(work / "report"), "--cache-dir", str(work.parent / f"cache-{checkout.name}")],
                         cwd=work, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(checkout)))
    took = time.monotonic() - t0
    if run.returncode != 0:
        raise SystemExit(f"the export from {checkout} failed: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", default=None, help="the git revision to compare with (a tag, a branch or a commit)")
    parser.add_argument("--flags", default="", help='flags ours adds to the export, against this checkout\'s default export')
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not args.against and not args.flags:
        parser.error("give --against REF (another revision) or --flags \"...\" (this checkout with those flags)")
    flags = shlex.split(args.flags)
    scratch = Path(tempfile.mkdtemp(prefix="aitune-export-time-"))
    theirs_dir = scratch / "theirs" if args.against else ROOT
    if args.against:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(theirs_dir), args.against], check=True, capture_output=True)
    ours, theirs = [], []
    try:
        for i in range(args.runs):
            theirs.append(one_export(theirs_dir, scratch / "work"))
            ours.append(one_export(ROOT, scratch / "work", flags))
            print(f"run {i + 1}: theirs {theirs[-1]:.1f} s, ours {ours[-1]:.1f} s", flush=True)
    finally:
        if args.against:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(theirs_dir)], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    ratio = statistics.median(ours) / statistics.median(theirs)
    against = args.against or "HEAD"
    line = (f"export_time ours={statistics.median(ours):.1f} theirs={statistics.median(theirs):.1f} ratio={ratio:.3f} runs={args.runs} "
            f"against={against} flags={'_'.join(flags) or 'none'}")
    from results import line_figures, merge_models, write_result

    key = f"against {args.against}" if args.against else " ".join(flags)
    entry = {**line_figures(line), "flags": " ".join(flags), "ours_s": [round(x, 1) for x in ours], "theirs_s": [round(x, 1) for x in theirs]}
    write_result("export_time", merge_models("export_time", {key: entry},
                                             {"settings": {"runs": args.runs, "model": "optimizer.examples.transformer:build",
                                                           "common flags": " ".join(ARGS), "order": "interleaved, theirs first"}}))
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
