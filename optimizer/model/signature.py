"""Names, dtypes and per-sample dims of a model's tensors: the one place that says which axes vary.

Dims never include the batch axis (as in Triton's `dims`); when the signature batches, axis 0 of
every tensor is the batch axis and its range is decided by the tune strategy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

from optimizer.errors import SignatureError
from optimizer.model.dtypes import DType, dtype_from_name

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Axis:
    """One per-sample axis: static when min == max, dynamic otherwise."""

    min: int
    max: int

    def __post_init__(self) -> None:
        if self.min < 1 or self.max < self.min:
            raise SignatureError(f"axis range {self.min}-{self.max} is invalid; use N or LOW-HIGH with 1 <= LOW <= HIGH.")

    @property
    def dynamic(self) -> bool:
        return self.min != self.max

    @property
    def triton_dim(self) -> int:
        """-1 on axes that really vary, the size otherwise."""
        return -1 if self.dynamic else self.min

    def __str__(self) -> str:
        return f"{self.min}-{self.max}" if self.dynamic else str(self.min)


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor: dtype, per-sample axes and, for integer inputs, the range of sample values."""

    name: str
    dtype: DType
    axes: tuple[Axis, ...]
    value_range: tuple[float, float] | None = None
    origin: str = ""  # an output's place in what forward() returns ("logits", "[1][0]"), when that is nested

    @property
    def dynamic_axes(self) -> tuple[int, ...]:
        """Indices (per-sample, batch excluded) of the axes that vary."""
        return tuple(i for i, a in enumerate(self.axes) if a.dynamic)

    @property
    def triton_dims(self) -> list[int]:
        return [a.triton_dim for a in self.axes]

    def shape(self, batch: int | None, point: str = "max") -> tuple[int, ...]:
        """A concrete shape at `point` ("min" or "max" of every dynamic axis), batch first when given."""
        dims = tuple(a.min if point == "min" else a.max for a in self.axes)
        return dims if batch is None else (batch, *dims)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype.name,
            "dims": [str(a) for a in self.axes],
            "value_range": list(self.value_range) if self.value_range else None,
            **({"origin": self.origin} if self.origin else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TensorSpec:
        return cls(
            name=d["name"],
            dtype=dtype_from_name(d["dtype"]),
            axes=tuple(parse_axis(s) for s in d["dims"]),
            value_range=tuple(d["value_range"]) if d.get("value_range") else None,
            origin=d.get("origin", ""),
        )


@dataclass(frozen=True)
class Signature:
    """Inputs in forward() order and outputs in return order; `batching` says whether axis 0 batches."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...] = ()
    batching: bool = True

    def input(self, name: str) -> TensorSpec:
        for t in self.inputs:
            if t.name == name:
                return t
        raise SignatureError(f"no input named {name!r}; the model's inputs are: {', '.join(self.input_names)}.")

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def is_dynamic(self) -> bool:
        return any(t.dynamic_axes for t in self.inputs)

    def describe(self) -> str:
        """One line for the progress log: every tensor with its dtype, axes and where its shape came from."""
        def one(t: TensorSpec) -> str:
            return f"{t.name}:{t.dtype.name}:{'x'.join(map(str, t.axes)) or 'scalar'}" + (f" ({t.origin})" if t.origin else "")

        return f"inputs {', '.join(one(t) for t in self.inputs)}; outputs {', '.join(one(t) for t in self.outputs)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "batching": self.batching,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Signature:
        return cls(
            inputs=tuple(TensorSpec.from_json(t) for t in d["inputs"]),
            outputs=tuple(TensorSpec.from_json(t) for t in d["outputs"]),
            batching=d["batching"],
        )


def check_tensor_name(name: str, what: str) -> str:
    """Names must be valid for every backend (ONNX, TorchScript, Triton, OpenVINO)."""
    if not _NAME_RE.match(name):
        raise SignatureError(
            f"{what} name {name!r} is not valid for every backend; use letters, digits and '_' "
            f"(starting with a letter or '_'), e.g. {re.sub(r'[^A-Za-z0-9_]', '_', name) or 'x'!r}."
        )
    return name


def parse_axis(text: str) -> Axis:
    """`N` (static) or `LOW-HIGH` (dynamic)."""
    text = text.strip()
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", text)
    if not m:
        raise SignatureError(f"dimension {text!r} is not N or LOW-HIGH; e.g. 3x64x64 or 1-128.")
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) else low
    return Axis(low, high)


@dataclass(frozen=True)
class InputSpec:
    """One parsed `--input NAME:DTYPE:DIMS` option; dims exclude the batch axis."""

    name: str
    dtype: DType
    axes: tuple[Axis, ...]


_INPUT_HELP = "use NAME:DTYPE:DIMS, e.g. image:float32:3x64x64 or input_ids:int64:1-128"


def parse_input_spec(text: str) -> InputSpec:
    """Parse `NAME:DTYPE:DIMS`; DIMS are per-sample (no batch axis), separated by 'x' or ','; '' means a scalar."""
    parts = text.split(":")
    if len(parts) != 3:
        raise SignatureError(f"--input {text!r} does not have three ':'-separated fields; {_INPUT_HELP}.")
    name, dtype, dims = (p.strip() for p in parts)
    if not name:
        raise SignatureError(f"--input {text!r} has an empty name; {_INPUT_HELP}.")
    check_tensor_name(name, "input")
    dt = dtype_from_name(dtype)
    axes = tuple(parse_axis(d) for d in re.split(r"[x,]", dims)) if dims else ()
    return InputSpec(name, dt, axes)


def parse_value_range(text: str) -> tuple[str, tuple[float, float]]:
    """Parse `NAME:LOW:HIGH` (inclusive bounds for generated sample values)."""
    parts = text.split(":")
    try:
        if len(parts) != 3:
            raise ValueError
        name, low, high = parts[0].strip(), float(parts[1]), float(parts[2])
    except ValueError:
        raise SignatureError(f"--value-range {text!r} is not NAME:LOW:HIGH; e.g. input_ids:0:999.") from None
    if not name or high < low:
        raise SignatureError(f"--value-range {text!r} needs a name and LOW <= HIGH; e.g. input_ids:0:999.")
    return name, (low, high)


def parse_output_names(values: Iterable[str]) -> list[str]:
    """Output names from repeated or comma-separated --output-names."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    for n in names:
        check_tensor_name(n, "output")
    if len(set(names)) != len(names):
        raise SignatureError(f"--output-names {','.join(names)} repeats a name; give each output a distinct name.")
    return names


def default_output_names(count: int) -> list[str]:
    """Triton's libtorch convention, valid for every backend."""
    return [f"output__{i}" for i in range(count)]


def merge_specs(
    inferred: Sequence[TensorSpec] | None,
    forward_names: Sequence[str] | None,
    specs: Sequence[InputSpec],
    value_ranges: dict[str, tuple[float, float]],
    optional: Sequence[str] = (),
) -> tuple[TensorSpec, ...]:
    """Combine what the model tells (names, example shapes) with what the user said (--input, --value-range).

    User specs win for dtype and dims; an input the user names that the model lacks is an error. `optional`:
    forward()'s positional arguments with defaults; those given by an example or --input become inputs too, in
    forward()'s order (every backend passes inputs by position), and one may not be skipped before a given one.
    """
    by_name = {t.name: t for t in inferred or ()}
    user = {s.name: s for s in specs}
    if len(user) != len(specs):
        raise SignatureError("--input names an input twice; give each input once.")
    known = list(forward_names or ()) + [n for n in optional if n not in (forward_names or ())]
    if known:
        unknown = [n for n in user if n not in known]
        if unknown:
            listed = ", ".join(known) if not optional else f"{', '.join(forward_names) or '(none required)'}; optional: {', '.join(optional)}"
            raise SignatureError(f"--input names {', '.join(map(repr, unknown))} but the model's inputs are: {listed}; use the forward() argument names.")
        given = set(by_name) | set(user)
        last = max([known.index(n) for n in given if n in known] + [len(forward_names or ()) - 1])
        names = known[:last + 1]
        if not names:
            raise SignatureError(f"forward() takes only optional arguments ({', '.join(optional[:4])}{', ...' if len(optional) > 4 else ''}) "
                                 f"and none was given; name the inputs you serve with --input, e.g. --input {optional[0]}:DTYPE:DIMS, "
                                 "or return example inputs from the factory.")
        skipped = [n for n in names if n not in given and n in optional]
        if skipped:
            after = next(n for n in reversed(names) if n in given)
            raise SignatureError(
                f"input {after!r} comes after forward() argument {skipped[0]!r}, which has no example and no --input spec; inputs are "
                f"passed by position, so give {skipped[0]!r} too (--input {skipped[0]}:DTYPE:DIMS) or wrap the model so that forward() "
                "takes only the inputs you serve.")
    else:  # forward(*args): the examples' names, else the user's
        names = [t.name for t in inferred or ()] or [s.name for s in specs]
        unknown = [n for n in user if n not in names]
        if unknown:
            raise SignatureError(f"--input names {', '.join(map(repr, unknown))} but the model's inputs are: {', '.join(names)}; "
                                 "use the forward() argument names.")
    result = []
    for n in names:
        if n in user:
            s = user[n]
            t = TensorSpec(n, s.dtype, s.axes)
            if n in by_name and len(by_name[n].axes) != len(s.axes):
                raise SignatureError(
                    f"--input {n} gives {len(s.axes)} per-sample dims but the example input has "
                    f"{len(by_name[n].axes)} ({'x'.join(map(str, by_name[n].axes))}); dims exclude the batch axis."
                )
            if n in by_name and by_name[n].value_range:
                t = replace(t, value_range=by_name[n].value_range)
        elif n in by_name:
            t = by_name[n]
        else:
            raise SignatureError(
                f"input {n!r} has no example and no --input spec; add --input {n}:DTYPE:DIMS, e.g. --input {n}:float32:3x224x224."
            )
        result.append(t)
    for n, rng in value_ranges.items():
        if n not in names:
            raise SignatureError(f"--value-range names {n!r} but the model's inputs are: {', '.join(names)}.")
    return tuple(replace(t, value_range=value_ranges.get(t.name, t.value_range)) for t in result)
