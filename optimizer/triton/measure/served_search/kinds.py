"""Both kinds of backend in one served search: one that pads every execution to max_batch_size (openvino) and one that
computes only the rows that came (onnxruntime, torchscript, torch-aoti) meet mixed shapes and light loads differently,
so the fastest passed candidate of the other kind than the in-process pick enters the search, in the same server, and
the choice is made on served measurements under the traffic and the load.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from optimizer.records.served_search import OperatingPoint, ServedSearch
from optimizer.records.tune_result import TuneResult
from optimizer.triton.config.front import needs_front
from optimizer.triton.config.spec import (
    batching_plan,
    config_signature,
    operating_point_of,
)
from optimizer.triton.repository.publish import PublishOptions, prepare_config
from optimizer.triton.measure.served_search.points import SearchSpace
from optimizer.triton.measure.served_search.request import SearchRequest
from optimizer.vocab import Device

if TYPE_CHECKING:
    from optimizer.triton.measure.served_search.run import SearchRun


def other_kind(result: TuneResult, options: PublishOptions, request: SearchRequest, gpu: bool) -> str | None:
    """The fastest passed candidate of the other kind than the selected one (a backend that pads every execution to
    max_batch_size, or one that computes only the rows that came), which the search can serve beside it: it enters the
    search, since the two kinds meet mixed shapes and light loads differently and the in-process peak at one shape
    cannot tell which serves the traffic better. None when there is none (why_no_other_kind says why)."""
    return next(iter(other_kind_candidates(result, options, request, gpu)), None)


def other_kind_candidates(result: TuneResult, options: PublishOptions, request: SearchRequest, gpu: bool) -> list[str]:
    selected = result.selected_candidate
    pads = selected.artifact.platform.pads_batch
    fronted = needs_front(config_signature(selected.artifact)[1], options.io_names)
    out = []
    for c in sorted((c for c in result.candidates if c.passed and c.name != selected.name and c.artifact is not None and c.artifact.platform is not None
                     and c.decision is not None and c.decision.profiles), key=lambda c: -c.decision.best.throughput):
        if c.artifact.platform.pads_batch == pads or Device.of(c.artifact.device).is_cuda != gpu or c.artifact.platform.platform == "tensorrt_plan":
            continue
        if config_signature(c.artifact)[1] != config_signature(selected.artifact)[1] or needs_front(config_signature(c.artifact)[1], options.io_names) != fronted:
            continue  # its served tensor names differ: the search's request mix is in the selected one's
        out.append(c.name)
    return out


def why_no_other_kind(result: TuneResult) -> str:
    """Why no candidate of the other kind entered the served search."""
    pads = result.selected_candidate.artifact.platform.pads_batch
    kind = "one that computes only the rows that came" if pads else "one that pads every execution to max_batch_size"
    passed = [c for c in result.candidates if c.passed and c.name != result.selected and c.artifact is not None and c.artifact.platform is not None
              and c.artifact.platform.pads_batch != pads]
    if not passed:
        return f"no passed candidate is {kind}"
    return f"the passed ones that are {kind} ({', '.join(c.name for c in passed)}) cannot be served beside it here (other tensor names or device)"


def enter_other_kind(run: SearchRun, name: str, where: Any, options: PublishOptions, request: SearchRequest, search: ServedSearch,
                      space: SearchSpace) -> None:
    """Measure the other kind's candidate in the same server: its rules' config, max 1, and its peak without a delay, in
    the selected one's instance layout; from then on its variants compete with the rest: its coarse pass (every layout and
    max) joins the search's, first when it leads, and it is refined when among the best."""
    from optimizer.triton.measure.served_search.run import OutOfTime

    selected = run.measurer.result
    cand = next(c for c in selected.candidates if c.name == name)
    other = replace(selected, selected=name, max_batch_size=cand.decision.max_batch_size)
    _padded_rules(other)
    text, extra, spec = prepare_config(other, options)
    start = operating_point_of(spec, cand.artifact.platform.thread_parameter)
    decision = cand.decision
    rules_delay = (batching_plan(decision, decision.peak, request.latency_budget_ms, request.percentile).max_queue_delay_microseconds
                   if (decision.peak or 0) > 1 else None)
    own = SearchSpace.of(decision, start, space.cores, space.gpu, request.concurrency or 0, request.user_max, rules_delay_us=rules_delay,
                         pads=cand.artifact.platform.pads_batch, loads=space.loads)
    run.measurer.results[name], run.spaces[name] = other, own
    run.measurer.loader.add_source(name, **where.source_of(other, extra))
    layout = {"instances": run.best.point.instances, "threads": run.best.point.threads}
    points = [replace(start, candidate=name)]
    if own.batching and not own.fixed_max:
        points += [OperatingPoint(1, (), 0, candidate=name, **layout), OperatingPoint(own.peak, (), 0, candidate=name, **layout)]
    try:
        run.measure(list(dict.fromkeys(points)), "coarse")
    except OutOfTime:
        pass
    kind = "pads every execution to max_batch_size" if cand.artifact.platform.pads_batch else "computes only the rows that came"
    search.kinds = f"{name} (which {kind}) entered the search beside {selected.selected}, measured in the same server"


def _padded_rules(result: TuneResult) -> None:
    """The rules' max for a backend that pads (find_max_batch_size.every_load_max), as the export sets it for the selected."""
    from optimizer.task.find_max_batch_size import every_load_max

    cand = result.selected_candidate
    decision = cand.decision
    if cand.artifact.platform.pads_batch and decision.decided_by != "recorded" and result.max_batch_size > 1:
        result.max_batch_size = every_load_max([p for p in decision.profiles if p.batch_size <= result.max_batch_size])
