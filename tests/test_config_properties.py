"""Property tests of the config renderer: whatever signature and measurements come in, the result parses as
Triton's ModelConfig and passes (or is refused by) the rules with an error, never a crash, and round-trips."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from optimizer.errors import OptimizerError
from optimizer.triton.config.model_config import canonical, parse
from optimizer.triton.repository.publish import PublishOptions, prepare_config
from tests.triton_records import make_result, profile, tensor

DTYPES = ["float32", "float16", "int64", "int32", "int8", "uint8", "bool", "float64"]
dims = st.lists(st.one_of(st.integers(1, 64).map(str), st.tuples(st.integers(1, 8), st.integers(1, 64)).map(lambda t: f"{t[0]}-{t[0] + t[1]}")),
                min_size=0, max_size=3).map(lambda ds: "x".join(ds))
specs = st.tuples(st.sampled_from(DTYPES), dims)


@st.composite
def results_args(draw):
    n_in = draw(st.integers(1, 3))
    n_out = draw(st.integers(1, 3))
    inputs = tuple(tensor(f"in_{i}", *draw(specs)) for i in range(n_in))
    outputs = tuple(tensor(f"output__{i}", *draw(specs)) for i in range(n_out))
    batching = draw(st.booleans())
    ladder = [1, 2, 4, 8, 16, 32][: draw(st.integers(1, 6))]
    latencies = sorted(draw(st.lists(st.floats(0.05, 500.0), min_size=len(ladder), max_size=len(ladder))))
    profiles = [profile(b, ms) for b, ms in zip(ladder, latencies)]
    knee = draw(st.sampled_from(ladder))
    budget = draw(st.one_of(st.none(), st.floats(0.1, 1000.0)))
    platform = draw(st.sampled_from(["onnxruntime_onnx", "pytorch_libtorch", "openvino"]))
    return dict(platform=platform, inputs=inputs, outputs=outputs, batching=batching, max_batch=ladder[-1], knee=knee,
                profiles=profiles, latency_budget_ms=budget, percentile=draw(st.sampled_from([50, 90, 95, 99])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(results_args(), st.booleans())
def test_rendered_configs_parse_pass_or_refuse_cleanly_and_round_trip(args, warmup):
    with tempfile.TemporaryDirectory() as tmp:
        result = make_result(Path(tmp), **args)
        try:
            text, _, spec = prepare_config(result, PublishOptions(Path(tmp) / "repo", "model", warmup=warmup))
        except OptimizerError as err:
            event(f"refused: {type(err).__name__}")
            assert str(err) and "\n" not in str(err)
            return
        event("rendered")
        config = parse(text)
        assert canonical(parse(canonical(config))) == text, "canonical text is a fixed point"
        assert config.name == "model"
        assert config.max_batch_size == (result.max_batch_size if args["batching"] else 0)
        for t, entry in zip(args["inputs"], config.input):
            assert entry.name == t.name and all(d >= 1 or d == -1 for d in entry.dims)
        db = config.dynamic_batching
        if config.HasField("dynamic_batching"):
            assert all(1 <= b <= config.max_batch_size for b in db.preferred_batch_size)
            assert db.max_queue_delay_microseconds >= 0
        assert config.instance_group[0].kind == 2  # KIND_CPU for CPU artifacts
