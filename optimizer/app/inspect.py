"""`aitune-export inspect`: what an export would use, without building anything.

It loads MODEL and runs it on generated samples (that is how outputs are observed), then reports
the signature, the candidates with their availability here and what the target Triton release
(--triton-release) can load, and the strategy's limits. Nothing
is written: no report folder, no repository, no artifact.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from optimizer.app.plan import plan_run
from optimizer.backend import EAGER, backend_named
from optimizer.backend.precision import run_precisions
from optimizer.machine import native_bf16
from optimizer.model.reference import resolve_signature
from optimizer.model.samples import batch_sizes_of, correctness_points, load_npz
from optimizer.model.signature import Signature, TensorSpec
from optimizer.model.source import load_model
from optimizer.settings import ExportSettings
from optimizer.task.correctness import DEFAULT_TOLERANCES, precision_tolerances
from optimizer.task.profiling import ProfileSettings
from optimizer.task.screening import screen
from optimizer.triton.config.spec import tensor_entry
from optimizer.vocab import PRECISIONS

log = logging.getLogger(__name__)


@dataclass
class CandidatePlan:
    """One backend as an export would meet it here: whether it would run, and if not, why."""

    name: str
    backend: str
    role: str  # "candidate" or "baseline"
    triton_platform: str | None
    model_file: str | None
    will_run: bool
    reason: str = ""


@dataclass
class Inspection:
    """The model, its signature, the candidates and the strategy's limits, as plain data (`to_json`)."""

    model: dict[str, Any]
    signature: Signature
    candidates: list[CandidatePlan]
    strategy: dict[str, Any]
    recorded_batch_sizes: list[int] = field(default_factory=list)
    triton_release: dict[str, Any] = field(default_factory=dict)  # task/release_gate.ReleaseGate.to_json()

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "signature": {
                "batching": self.signature.batching,
                "inputs": [_tensor_json(t, self.signature.batching) for t in self.signature.inputs],
                "outputs": [_tensor_json(t, self.signature.batching) for t in self.signature.outputs],
            },
            "candidates": [asdict(c) for c in self.candidates],
            "strategy": self.strategy,
            "recorded_batch_sizes": self.recorded_batch_sizes,
            "triton_release": self.triton_release,
        }


def inspect_model(settings: ExportSettings) -> Inspection:
    """Load MODEL, infer its signature and plan the candidates exactly as `export` would, building nothing."""
    plan = plan_run(settings, publishing=False)
    strategy, device = plan.strategy, plan.device
    model = load_model(settings.model)
    signature = resolve_signature(model, plan.input_specs, plan.value_ranges, plan.output_names, settings.batching)
    recorded: list[int] = []
    if settings.samples:
        feeds = load_npz(Path(settings.samples), signature)
        recorded = sorted(batch_sizes_of(feeds)) if signature.batching else []
    plans = []
    if strategy.wants_eager(model.format):
        eager = backend_named(EAGER)
        av = eager.availability(device)
        plans.append(CandidatePlan(eager.candidate_name(device), eager.name, "baseline", None, None, bool(av),
                                   av.reason or f"measured as the baseline (eager gate {strategy.eager_gate})"))
    calibration = settings.calibration_samples or settings.samples  # INT8 candidates exist only with real samples
    backends = strategy.backends_for_run(model.module, device, settings.precision, plan.cache_root, calibration)  # as export tries them
    gate = plan.release_gate
    for backend in backends:
        refused = gate.refusal(backend) if gate is not None and model.format in backend.consumes else None
        if refused is not None:  # export skips it (or, named with --backend, refuses the run) for this reason
            plans.append(CandidatePlan(backend.candidate_name(device), backend.name, "candidate", backend.triton_platform,
                                       backend.model_filename, False, refused.message()))
            continue
        s = screen(backend, model.format, device)
        plans.append(CandidatePlan(s.name, backend.name, "candidate", backend.triton_platform, backend.model_filename, s.runnable, s.reason))
    policy = strategy.batch_policy(tuple(recorded))
    budget = strategy.memory_budget_mb  # the value the strategy holds ("auto" reads free memory once, in the plan)
    overrides = precision_tolerances(signature, settings.precision, plan.tolerances)
    return Inspection(
        model={
            "spec": settings.model or "bundled example",
            "source": model.source.to_json(),
            "name": settings.name or model.name,
            "format": model.format,
            "distributed": model.distributed,
        },
        signature=signature,
        candidates=plans,
        strategy={
            "name": strategy.name,
            "workflow": settings.workflow,
            "device": str(device),
            "precision": settings.precision,
            "precisions": sorted({b.settings["precision"] for b in backends}, key=PRECISIONS.index),
            "precision_left_out": run_precisions(settings.precision, str(device), calibration is not None, native_bf16())[1],
            "accuracy_budget": plan.accuracy.to_json(),
            "eager_gate": strategy.eager_gate,
            "batch_policy": policy.to_json(),
            "memory_budget_mb": None if budget is None else round(budget),
            "time_budget_s": settings.time_budget_s,
            "build_timeout_s": settings.build_timeout_s,
            "profile_timeout_s": settings.profile_timeout_s,
            "profile": asdict(ProfileSettings()),
            "correctness_points": [p.label for p in correctness_points(signature)],
            "tolerances": {k: {"atol": t.atol, "rtol": t.rtol} for k, t in DEFAULT_TOLERANCES.items()},
            "tolerance_overrides": {k or "*": {"atol": t.atol, "rtol": t.rtol} for k, t in overrides.items()},
        },
        recorded_batch_sizes=recorded,
        triton_release=gate.to_json(backends) if gate is not None else {},
    )


def _tensor_json(t: TensorSpec, batching: bool) -> dict[str, Any]:
    entry = tensor_entry(t, batching)  # dims and reshape as config.pbtxt will have them (a per-sample scalar: [1], reshape [])
    return {
        "name": t.name,
        "dtype": t.dtype.name,
        "dims": [str(a) for a in t.axes],
        "triton_dims": entry.dims,
        **({"triton_reshape": entry.reshape} if entry.reshape is not None else {}),
        "dynamic_axes": list(t.dynamic_axes),
        "value_range": list(t.value_range) if t.value_range else None,
        **({"origin": t.origin} if t.origin else {}),
    }


def describe(inspection: Inspection) -> list[str]:
    """The inspection as aligned plain lines for a terminal (`to_json` is the machine-readable form)."""
    doc = inspection.to_json()
    m, sig, st = doc["model"], doc["signature"], doc["strategy"]
    policy = st["batch_policy"]
    lines = [f"model       {m['name']}  ({m['source']['kind']} {m['source']['spec']}, {m['format']})"]
    lines.append("batching    " + ("axis 0 of every tensor is the batch axis" if sig["batching"] else "none (max_batch_size 0)"))
    width = max(len(t["name"]) for t in sig["inputs"] + sig["outputs"])
    for title, tensors in (("inputs", sig["inputs"]), ("outputs", sig["outputs"])):
        lines.append(title)
        for t in tensors:
            dims = "x".join(t["dims"]) or "scalar"
            dynamic = ", ".join(f"dims[{i}] {t['dims'][i]}" for i in t["dynamic_axes"]) or "none"
            values = f"  values {t['value_range'][0]:g}..{t['value_range'][1]:g}" if t["value_range"] else ""
            origin = f"  from forward()'s {t['origin']}" if t.get("origin") else ""
            reshape = f" reshape {t['triton_reshape']}" if "triton_reshape" in t else ""
            lines.append(f"  {t['name']:<{width}}  {t['dtype']:<8} {dims:<14} triton dims {t['triton_dims']}{reshape}  dynamic: {dynamic}{values}{origin}")
    release = doc["triton_release"]
    if release:
        lines.append(f"triton      {release['summary']}" + ("; --allow-version-mismatch" if release["allow_version_mismatch"] else ""))
        caveats: list[str] = []  # one per backend and fact: each precision of a backend is checked alike
        for check in release["checks"]:  # version caveats and what --allow-version-mismatch let through
            if check["verdict"] in ("mismatch", "unknown") and release["allow_version_mismatch"]:
                caveats.append(f"  {check['backend']} {check['fact']}: {check['problem']} (allowed by --allow-version-mismatch)")
            elif check["note"] and check["fact"] in ("torch", "tensorrt", "openvino"):
                caveats.append(f"  {check['backend']} {check['fact']}: {check['note']}")
        lines.extend(dict.fromkeys(caveats))
    lines.append(f"candidates  (strategy {st['name']}, workflow {st['workflow']}, device {st['device']})")
    width = max((len(c["name"]) for c in doc["candidates"]), default=0)
    for c in doc["candidates"]:
        target = f"{c['triton_platform']} {c['model_file']}" if c["triton_platform"] else "baseline, not published"
        state = "will run" if c["will_run"] else "will not run"
        lines.append(f"  {c['name']:<{width}}  {target:<30} {state}" + (f": {c['reason']}" if c["reason"] else ""))
    lines.append("strategy")
    if policy["batch_sizes"]:
        batch = f"only the recorded sizes {', '.join(map(str, policy['batch_sizes']))}"
    elif policy["max_batch_size"]:
        batch = f"up to {policy['max_batch_size']} (--max-batch-size)"
    else:
        batch = (f"auto: 1, 2, 4, ... up to {policy['search_cap']}, stopping when throughput gains under "
                 f"{100 * policy['saturation_gain']:g}% for {policy['saturation_steps']} steps, an allocation fails or the budget is exceeded")
    budget = f"p{policy['percentile']} <= {policy['latency_budget_ms']:g} ms" if policy["latency_budget_ms"] else f"none (percentile p{policy['percentile']})"
    prof = st["profile"]
    memory = "none" if st["memory_budget_mb"] is None else f"{st['memory_budget_mb']} MiB added per candidate while probing"
    lines += [
        f"  precision         {st['precision']}: candidates at {', '.join(st['precisions']) or 'none'}"
        + "".join(f"; {note}" for note in st["precision_left_out"]),
        f"  accuracy gate     bf16/int8 candidates against fp32 eager: "
        + (f"--accuracy-check {st['accuracy_budget']['check']} decides" if st["accuracy_budget"]["check"] else
           f"cosine >= {st['accuracy_budget']['cosine']:g}, top-1 >= {st['accuracy_budget']['top1']:g} for class scores"),
        f"  eager gate        {st['eager_gate']}",
        f"  batch sizes       {batch}",
        f"  latency budget    {budget}",
        f"  memory budget     {memory}",
        f"  time limits       time budget {_seconds(st['time_budget_s'])}, build timeout {_seconds(st['build_timeout_s'])}, "
        f"profile timeout {_seconds(st['profile_timeout_s'])}",
        f"  correctness       at {'; '.join(st['correctness_points'])}; "
        + ", ".join(f"{k} atol {v['atol']:g} rtol {v['rtol']:g}" for k, v in st["tolerances"].items()) + "; integers exact"
        + "".join(f"; {'every output' if k == '*' else 'output ' + k}: atol {v['atol']:g} rtol {v['rtol']:g} (override)"
                  for k, v in st["tolerance_overrides"].items()),
        f"  profiling         {prof['warmup_runs']} warmup runs, {prof['window_s']:g} s windows until {prof['stable_windows']} "
        f"in a row vary under {100 * prof['cv_threshold']:g}%, at most {prof['time_cap_s']:g} s per batch size",
    ]
    return lines


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:g} s"
