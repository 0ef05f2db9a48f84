"""The choice lists and small values every layer shares, written once and parsed once.

Settings, the CLI's `click.Choice`s, the strategies and the report all read their choices from
here, so a new precision or strategy name cannot be accepted in one place and refused in another.
`Device` is the parsed `--device`: code asks `device.kind` instead of splitting strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from optimizer.errors import SettingsError

DEVICE_KINDS = ("cpu", "cuda")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
"""Precisions a candidate is built at; each (backend, precision) pair is its own candidate."""
PRECISION_CHOICES = ("auto", *PRECISIONS)
"""--precision values: a named precision restricts the search to it; auto lets the machine and the samples decide."""
WORKFLOWS = ("aot", "jit")
EAGER_GATES = ("enabled", "diagnostic", "disabled")
PERCENTILES = (50, 90, 95, 99)
ARRIVALS = ("poisson", "constant")
"""How requests arrive when a rate is measured: perf_analyzer's --request-distribution (a trace has its own schedule)."""
STRATEGY_NAMES = ("max-throughput", "min-latency", "latency-budget", "first-wins", "one-backend")
"""CLI names of the strategies, in the order `--help` shows them (tune_strategy.STRATEGIES maps them to classes)."""

MAX_BATCH_SIZE_LIMIT = 2**31 - 1
"""Triton's max_batch_size is an int32."""

_DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


@dataclass(frozen=True)
class Device:
    """Where a model is tuned and served: `kind` "cpu" or "cuda", and the GPU `index` (None: the CPU, or plain "cuda")."""

    kind: str
    index: int | None = None

    @classmethod
    def parse(cls, text: str) -> Device:
        """"cpu", "cuda" (GPU 0) or "cuda:N"; anything else is a SettingsError naming the accepted forms."""
        m = _DEVICE.match(str(text).strip())
        if not m or (m.group(1) == "cpu" and m.group(2) is not None):
            raise SettingsError(f"--device {text!r} is not cpu or cuda[:N]; e.g. --device cuda:0.")
        if m.group(1) == "cpu":
            return cls("cpu")
        return cls("cuda", int(m.group(2)) if m.group(2) is not None else None)

    @classmethod
    def of(cls, value: Device | str) -> Device:
        """A Device as is, or parsed from its text (records and job payloads carry devices as text)."""
        return value if isinstance(value, Device) else cls.parse(value)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def cuda_index(self) -> int:
        """The GPU index ("cuda" is GPU 0); a SettingsError on the CPU (asking it there is a caller's mistake)."""
        if not self.is_cuda:
            raise SettingsError(f"device {self} is not cuda or cuda:N; e.g. --device cuda:0.")
        return self.index or 0

    def __str__(self) -> str:
        """The text users wrote and records keep: "cpu", "cuda", "cuda:1"."""
        return self.kind if self.index is None else f"{self.kind}:{self.index}"
