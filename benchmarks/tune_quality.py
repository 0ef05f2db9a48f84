"""How good is the default strategy's choice, and how long does it take?

For each bundled example: run the default export (timed), then re-measure every deployable
candidate at every batch size of a fixed ladder in fresh processes (the exhaustive answer), and
compare the throughput of what was chosen (the selected backend at batch sizes up to the
published max_batch_size) with the best throughput measured anywhere. Runs the export twice to
show whether the choice repeats.

Usage: .venv/bin/python benchmarks/tune_quality.py [--models cnn,transformer] [--repeats 2]
Ends with one line per model: tune_quality model=<name> ratio=<r> tune_seconds=<s>
and writes benchmarks/results/tune_quality.json (results.py): those figures per model, with the choice, the best
measured anywhere and the choices of every run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # results: the benchmarks' records

from results import line_figures, merge_models, write_result  # noqa: E402

from optimizer.app.export import export  # noqa: E402
from optimizer.records.candidate import Candidate  # noqa: E402
from optimizer.records.measurements import BatchPolicy  # noqa: E402
from optimizer.settings import ExportSettings  # noqa: E402
from optimizer.task.evaluation import MeasureJob  # noqa: E402
from optimizer.task.isolation import run_isolated  # noqa: E402
from optimizer.task.profiling import ProfileSettings  # noqa: E402

MODELS = {
    "cnn": {"model": "optimizer.examples.cnn:build"},
    "transformer": {
        "model": "optimizer.examples.transformer:build",
        "input": ["input_ids:int64:1-128"],
        "value_range": ["input_ids:0:999"],
    },
}
LADDER = (1, 2, 4, 8, 16, 32, 64)


def exhaustive(result, cand: Candidate, ladder: tuple[int, ...], workdir: Path) -> dict[int, float]:
    """Throughput of one candidate at every ladder size, measured in a fresh process."""
    job = MeasureJob(
        candidate=cand.to_json(),
        source=result.source,
        signature=result.signature,
        workdir=str(workdir),
        profile_feed=result.reference.profile_feed,
        policy=BatchPolicy(batch_sizes=ladder).to_json(),
        profile=asdict(ProfileSettings()),
        state_dict=None,
    )
    outcome = run_isolated("optimizer.task.evaluation:measure_candidate", job.to_json(), workdir, 1200, "exhaustive")
    if not outcome.ok:
        raise RuntimeError(f"{cand.name}: {outcome.reason}")
    measured = Candidate.from_json(outcome.value)
    return {p.batch_size: p.throughput for p in measured.decision.profiles}


def run_model(name: str, spec: dict, repeats: int, root: Path) -> tuple[float, float, dict]:
    """(chosen/best throughput, the first export's seconds, what the record says beside them)."""
    runs = []
    for i in range(repeats):
        out = root / f"{name}-{i}"
        settings = ExportSettings(repository=str(out / "repo"), report_dir=str(out / "report"), cache=False, **spec)  # every run measures
        t0 = time.perf_counter()
        outcome = export(settings)
        runs.append((outcome, time.perf_counter() - t0))
        r = outcome.result
        print(f"{name} run {i + 1}: selected {r.selected} max_batch_size {r.max_batch_size} in {runs[-1][1]:.1f} s")
    result = runs[0][0].result
    ladder = tuple(b for b in LADDER if b <= max(LADDER[-1], result.max_batch_size)) or LADDER
    table: dict[str, dict[int, float]] = {}
    for cand in result.candidates:
        if cand.passed:
            table[cand.name] = exhaustive(result, cand, ladder, root / f"{name}-exhaustive" / cand.backend)
            row = "  ".join(f"b{b}={t:.0f}" for b, t in table[cand.name].items())
            print(f"{name} exhaustive {cand.name}: {row}")
    best_name, best_batch, best = max(((n, b, t) for n, row in table.items() for b, t in row.items()), key=lambda x: x[2])
    chosen_row = table[result.selected]
    chosen = max(t for b, t in chosen_row.items() if b <= max(result.max_batch_size, 1))
    print(f"{name}: best measured {best:.1f}/s ({best_name} at batch {best_batch}); chosen {chosen:.1f}/s ({result.selected} up to batch {result.max_batch_size})")
    print(f"{name}: max_batch_size over {repeats} runs: {[o.result.max_batch_size for o, _ in runs]}; selected: {[o.result.selected for o, _ in runs]}")
    detail = {"selected": result.selected, "max_batch_size": result.max_batch_size, "chosen": round(chosen, 1), "best": round(best, 1),
              "best_candidate": best_name, "best_batch": best_batch, "selected_per_run": ", ".join(o.result.selected for o, _ in runs),
              "max_batch_size_per_run": ", ".join(str(o.result.max_batch_size) for o, _ in runs)}
    return chosen / best, runs[0][1], detail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="cnn,transformer")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    lines, figures = [], {}
    with tempfile.TemporaryDirectory(prefix="tune_quality-") as tmp:
        for name in args.models.split(","):
            ratio, seconds, detail = run_model(name, MODELS[name], args.repeats, Path(tmp))
            lines.append(f"tune_quality model={name} ratio={ratio:.3f} tune_seconds={seconds:.1f}")
            figures[name] = {**{k: v for k, v in line_figures(lines[-1]).items() if k != "model"}, **detail}
    for line in lines:
        print(line)
    write_result("tune_quality", merge_models("tune_quality", figures, {"settings": {
        "repeats": args.repeats, "ladder": ", ".join(map(str, LADDER)),
        "ratio": "chosen / best throughput, each the most one measurement gave (exhaustive pass, one process per candidate); no interval"}}))


if __name__ == "__main__":
    main()
