"""validate's open-loop check: requests sent on a schedule whatever the answers' pace, as production traffic arrives.

A closed-loop sweep (N clients that each wait for an answer) never queues more than N requests, so it cannot prove a
rate. This check can: it drives the published config at the export's claimed capacity (report.json's `capacity`) and
below it, or at --rate R, under the claim's arrivals, percentile and budget, and says per rate whether it was held.

What fails validate (exit 1): a rate the user asked for (--rate R, or a --traffic trace at its own rate) not held, and
0.8x the claimed capacity not held (the claim is then wrong, not noisy). The claimed capacity itself not held is a
warning: the claim is the highest rate the search saw held, so one run exactly there lands on either side of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from optimizer.errors import SettingsError, ValidationError
from optimizer.events import Event, EventSink
from optimizer.model.samples import load_feeds
from optimizer.records.capacity import Capacity, RateLevel, arrivals_label
from optimizer.triton.measure.client import max_batch
from optimizer.triton.measure.target import ModelTarget
from optimizer.triton.measure.validation.checks import served_names
from optimizer.triton.measure.validation.expectation import ExportReference
from optimizer.triton.runtime.server import triton_message
from optimizer.vocab import ARRIVALS

OPEN_LOOP_WINDOW_MS = 4000
"""Each rate is measured over three windows this long: open-loop latency on a few cores settles only over seconds (the
served search, which measures many variants, takes shorter ones)."""
OPEN_LOOP_WINDOWS = 3
CLAIM_SHARES = ((0.8, True), (1.0, False))
"""(share of the claimed capacity, whether not holding it fails validate)."""
DEFAULT_PERCENTILE = 95


@dataclass(frozen=True)
class OpenLoopAsk:
    """What the user asked of the open-loop check (validate's --rate, --arrivals, --latency-budget-ms, --rate-window)."""

    rate: float | None = None
    arrivals: str | None = None  # None: the trace's schedule when there is one, else the claim's, else poisson
    latency_budget_ms: float | None = None
    window_ms: int = OPEN_LOOP_WINDOW_MS

    def check(self) -> None:
        """SettingsError (exit 2) before any work for a value that cannot be measured."""
        if self.rate is not None and not self.rate > 0:
            raise SettingsError(f"--rate {self.rate:g} must be a positive number of requests per second, e.g. --rate 50.")
        if self.latency_budget_ms is not None and not self.latency_budget_ms > 0:
            raise SettingsError(f"--latency-budget-ms {self.latency_budget_ms:g} must be a positive number of milliseconds.")
        if self.arrivals is not None and self.arrivals not in ARRIVALS:
            raise SettingsError(f"--arrivals {self.arrivals!r} is not one of {', '.join(ARRIVALS)}.")
        if self.window_ms < 500:
            raise SettingsError(f"--rate-window {self.window_ms} is too short to hold a rate; give at least 500 ms.")


@dataclass
class Step:
    """One rate to measure and what it stands for."""

    rate: float
    role: str  # "0.8x the claimed capacity", "the claimed capacity", "--rate", "the trace's own rate"
    required: bool  # not held fails validate


@dataclass
class OpenLoopPlan:
    """The rates, arrivals, percentile and budget of the check, and where they came from."""

    steps: list[Step]
    arrivals: str  # "poisson", "constant" or "trace"
    percentile: int
    latency_budget_ms: float | None
    source: str  # in words: the claim, --rate, the trace
    claim: Capacity | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        """"p95 <= 20 ms", or what holding means without a budget."""
        if self.latency_budget_ms is None:
            return "no latency budget: held means served at least 97% of the offered rate"
        return f"p{self.percentile} <= {self.latency_budget_ms:g} ms"


def plan_open_loop(ask: OpenLoopAsk, claim: dict[str, Any] | None, trace_ms: Sequence[float] | None,
                   user_trace: bool = False) -> OpenLoopPlan | None:
    """What to measure: --rate R; else 0.8x and 1.0x the export's claimed capacity; else a --traffic trace at its own
    mean rate; None when nothing asks for an open-loop figure. `trace_ms` is the schedule of the requests sent (the
    user's --traffic or the export's traffic); `user_trace` says it is the user's --traffic."""
    found = Capacity.from_json(claim) if claim else None
    if found is not None and not found.rate_per_s:
        found = None  # the export held no rate: there is no claim to prove
    if ask.rate is None and found is None and not (user_trace and trace_ms):
        return None
    notes: list[str] = []
    if ask.arrivals is not None:
        arrivals = ask.arrivals
    elif trace_ms and (user_trace or found is None or found.arrivals == "trace"):
        arrivals = "trace"
    elif found is not None and found.arrivals in ARRIVALS:
        arrivals = found.arrivals
    else:
        arrivals = "poisson"
        if found is not None and found.arrivals == "trace":
            notes.append("the claim was measured on the export's trace, whose timestamps are not here: measured with Poisson arrivals")
    percentile = found.percentile if found is not None else DEFAULT_PERCENTILE
    budget = ask.latency_budget_ms if ask.latency_budget_ms is not None else (found.latency_budget_ms if found is not None else None)
    if ask.rate is not None:
        steps, source = [Step(ask.rate, "--rate", True)], f"--rate {ask.rate:g}"
        if found is not None:
            notes.append(f"the export's claim ({found.rate_per_s:g} requests/s) was not checked: --rate {ask.rate:g} was measured instead")
    elif found is not None:
        steps = [Step(round(found.rate_per_s * share, 3), "the claimed capacity" if share == 1.0 else f"{share:g}x the claimed capacity", required)
                 for share, required in CLAIM_SHARES]
        source = f"the export's claim: {found.describe()}"
    else:
        from optimizer.model.traffic import trace_figures

        rate = trace_figures(list(trace_ms or ()))["rate_per_s"]
        steps, source = [Step(rate, "the trace's own rate", True)], f"the --traffic trace at its own mean rate ({rate:g} requests/s)"
    return OpenLoopPlan(steps, arrivals, percentile, budget, source, found, notes)


def schedule(plan: OpenLoopPlan, step: Step, trace_ms: Sequence[float] | None, seed: int) -> list[int]:
    """The gaps (us) perf_analyzer sends on: the trace's scaled to the step's rate (its bursts kept), or generated."""
    from optimizer.triton.runtime.perf_analyzer_rate import arrival_gaps_us, trace_gaps_us

    if plan.arrivals == "trace" and trace_ms:
        return trace_gaps_us(list(trace_ms), step.rate)
    return arrival_gaps_us(step.rate, plan.arrivals, seed=seed)


def run_open_loop(plan: OpenLoopPlan, measure: Callable[[Step, int], RateLevel]) -> list[dict[str, Any]]:
    """Every step measured (also after one fails: the whole picture says how far off the claim is) and judged."""
    levels = []
    for k, step in enumerate(plan.steps):
        level = measure(step, k).judge(plan.latency_budget_ms, plan.percentile)
        levels.append({"role": step.role, "required": step.required, **level.to_json()})
    return levels


def verdict(plan: OpenLoopPlan, levels: list[dict[str, Any]]) -> tuple[str, str]:
    """("held" | "warning" | "not held", one line saying so with the figures): a required rate not held is "not held"
    (validate fails); only the claimed capacity itself not held is a "warning"."""
    how = f"open-loop, {arrivals_label(plan.arrivals)}, {plan.target}"
    missed = [lv for lv in levels if not lv["held"]]
    if not missed:
        rates = " and ".join(f"{lv['offered']:.4g}/s ({lv['role']})" for lv in levels)
        return "held", f"held {rates} ({how})"
    words = "; ".join(f"{lv['offered']:.4g}/s ({lv['role']}) not held: {lv['why']}" for lv in missed)
    if any(lv["required"] for lv in missed):
        fix = (" the claim does not hold here: re-export on this machine, or plan replicas from a lower rate"
               if plan.claim is not None and plan.source.startswith("the export's claim") else "")
        return "not held", f"{words} ({how}){';' if fix else ''}{fix}"
    held = ", ".join(f"{lv['offered']:.4g}/s" for lv in levels if lv["held"])
    return "warning", (f"{words} ({how}); {held} held: a single run at capacity lands on "
                       "either side of it, so this is a warning; plan replicas with --headroom")


def open_loop_record(plan: OpenLoopPlan, levels: list[dict[str, Any]], protocol: str, window_ms: int, sending: str) -> dict[str, Any]:
    """validation.json's `open_loop` section."""
    status, summary = verdict(plan, levels)
    claim = plan.claim
    return {"source": plan.source, "verdict": status, "summary": summary, "arrivals": plan.arrivals,
            "arrivals_label": arrivals_label(plan.arrivals), "percentile": plan.percentile, "latency_budget_ms": plan.latency_budget_ms,
            "claim": ({"rate_per_s": claim.rate_per_s, "latency_budget_ms": claim.latency_budget_ms, "percentile": claim.percentile,
                       "arrivals": claim.arrivals} if claim is not None else None),
            "protocol": protocol, "window_ms": window_ms, "windows": OPEN_LOOP_WINDOWS, "sending": sending, "levels": levels,
            "notes": plan.notes}


def signature_of_config(config: Any) -> Any:
    """The served config's inputs as a Signature (dims -1: any size), to check a --traffic file when no export report is
    at hand; SettingsError when the config lists no input or one --traffic cannot hold."""
    from tritonclient.grpc import model_config_pb2

    from optimizer.errors import SignatureError
    from optimizer.model.dtypes import dtype_from_name
    from optimizer.model.signature import Axis, Signature, TensorSpec

    if not config.input:
        raise SettingsError("--traffic needs the model's inputs: the config lists none; pass --report DIR (the export's report folder).")
    specs = []
    for spec in config.input:
        try:
            dtype = dtype_from_name(model_config_pb2.DataType.Name(spec.data_type))
        except SignatureError:
            raise SettingsError(f"--traffic cannot describe input {spec.name!r} ({model_config_pb2.DataType.Name(spec.data_type)}); "
                                "validate without --traffic sends the export's requests.") from None
        dims = list(spec.dims)
        specs.append(TensorSpec(spec.name, dtype, tuple(Axis(1, 1 << 30) if d < 0 else Axis(int(d), int(d)) for d in dims)))
    return Signature(tuple(specs), batching=config.max_batch_size > 0)


def write_trace_input(path: Path, feeds: list[Any], batching: bool) -> Path:
    """perf_analyzer's input data for a trace: every request in the trace's order (its schedule is theirs)."""
    from optimizer.triton.runtime.perf_analyzer_input import write_input_data

    return write_input_data(path, feeds, batching, max_entries=len(feeds))


def check_open_loop(record: Any, target: ModelTarget, reference: ExportReference | None, served: dict[str, Any], ask: OpenLoopAsk,
               user_traffic: Any, input_data: Path, url: str, protocol: str, folder: Path, work: Path, on_event: EventSink) -> None:
    """The open-loop check (open_loop.py) when a rate is asked or the export claims a capacity: a required rate not held
    fails the validation, the claimed capacity itself not held is a note."""
    from optimizer.triton.runtime.perf_analyzer_rate import RateSettings, measure_rate, write_intervals

    if user_traffic is not None:
        trace, user_trace = user_traffic.timestamps_ms, True
    else:
        trace, user_trace = (reference.trace_ms if reference is not None else None), False
    plan = plan_open_loop(ask, reference.capacity if reference is not None else None, trace, user_trace)
    if plan is None:
        return
    sending, data = record.traffic, input_data
    if plan.arrivals == "trace":  # every request of the trace, in its order: the schedule is theirs
        rename = served_names(reference, served) if reference is not None else {}
        if user_traffic is not None:
            feeds = list(user_traffic.requests)
        else:
            from optimizer.model.signature import Signature
            from optimizer.model.traffic import Traffic

            feeds = load_feeds(reference.traffic)
            if reference.client_padding:
                feeds = list(Traffic(tuple(feeds), "file", "").padded(Signature.from_json(reference.signature),
                                                                       list(reference.client_padding["edges"])).requests)
        feeds = [{rename.get(k, k): a for k, a in f.items()} for f in feeds]
        data = write_trace_input(work / "open_loop" / "trace_input.json", feeds, max_batch(served) > 0)
        sending = f"{record.traffic.split(' (')[0]}: all {len(feeds)} requests in the trace's order"
    rate_settings = RateSettings(protocol=protocol, window_ms=ask.window_ms, windows=OPEN_LOOP_WINDOWS)

    def measure(step: Step, k: int) -> Any:
        on_event(Event("validate", "progress", target.name, f"open-loop at {step.rate:g} requests/s ({step.role}, "
                                                             f"{arrivals_label(plan.arrivals)})"))
        intervals = write_intervals(work / "open_loop" / f"intervals_{k}.txt", schedule(plan, step, trace, seed=k))
        return measure_rate(target.name, url, data, intervals, work / "perf_analyzer", rate_settings)

    from tritonclient.utils import InferenceServerException

    try:
        levels = run_open_loop(plan, measure)
    except ValidationError as err:
        record.status, record.reason = "failed", f"open-loop: {err}"
        return
    except InferenceServerException as err:
        record.status, record.reason = "failed", f"Triton stopped answering during the open-loop check: {triton_message(err)}"
        return
    record.open_loop = open_loop_record(plan, levels, protocol, ask.window_ms, sending)
    state, summary = record.open_loop["verdict"], record.open_loop["summary"]
    if state == "not held":
        record.status, record.reason = "failed", f"open-loop: {summary}"
    elif state == "warning":  # the open_loop section says which rate and why
        record.reason += "; open-loop: the claimed capacity itself not held (a warning: 0.8x of it held)"
    else:
        record.reason += f"; open-loop: {summary}"


def load_user_traffic(path: Path, reference: ExportReference | None, target: ModelTarget) -> Any:
    """validate --traffic FILE: its requests checked against the export's signature (the forward names), else the served
    config's inputs; TrafficError (exit 2) for a bad file."""
    from optimizer.model.signature import Signature
    from optimizer.model.traffic import load_traffic

    signature = Signature.from_json(reference.signature) if reference is not None and reference.signature else signature_of_config(target.config)
    return load_traffic(path, signature)
