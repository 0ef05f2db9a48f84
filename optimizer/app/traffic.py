"""`aitune-export traffic FILE`: what a traffic file holds, checked before an export or a validate spends minutes on it.

The same reader as `export --traffic` (model/traffic.py), so a file this command accepts against a signature is one
export accepts, with the same one-line errors. Against a model (MODEL or --input) every entry is checked as export
would; with neither, the file's own structure is checked and each input's shapes are reported, with the --input flags
that describe them.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from optimizer.errors import TrafficError
from optimizer.model.dtypes import DTYPES
from optimizer.model.signature import Axis, Signature, TensorSpec, parse_input_spec
from optimizer.model.traffic import FORMAT_HINT, load_traffic, read_entries
from optimizer.records.traffic import TrafficSummary

B64_DTYPES = {1: "uint8", 2: "float16", 4: "float32", 8: "float64"}
"""Without a signature, b64 content says only its bytes per value: the dtype reported is this guess."""


@dataclass
class TrafficCheck:
    """What `traffic` found: the file, what it was checked against, its summary and each input's shapes."""

    file: str
    checked_against: str  # "MODEL ...", "--input ...", or "the file's own structure"
    summary: TrafficSummary
    inputs: list[dict[str, Any]] = field(default_factory=list)  # name, dtype, dims ("1-128"), shapes (distinct), --input flag
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "checked_against": self.checked_against, "summary": self.summary.to_json(),
                "inputs": self.inputs, "notes": self.notes}


def check_traffic(path: Path | str, model: str | None = None, inputs: Sequence[str] = ()) -> TrafficCheck:
    """Read and check a traffic file: against MODEL's signature (with --input on top, as export merges them), against
    --input alone, or (neither) against its own structure. TrafficError / SignatureError (exit 2) on bad input."""
    path = Path(path)
    specs = [parse_input_spec(text) for text in inputs]
    notes: list[str] = []
    if model:
        signature, against = _model_signature(model, specs), f"MODEL {model}"
    elif specs:
        signature = Signature(tuple(TensorSpec(s.name, s.dtype, s.axes) for s in specs))
        against = "--input " + " --input ".join(inputs)
    else:
        signature, guessed = _file_signature(read_entries(path, repr(str(path))), repr(str(path)))
        against = "the file's own structure (give MODEL or --input to check the entries against a signature)"
        if guessed:
            notes.append(f"{', '.join(guessed)} hold b64 content: the dtype shown is a guess from its bytes per value")
    traffic = load_traffic(path, signature, option="")
    summary = traffic.summary(signature)
    per_input = []
    for spec in signature.inputs:
        shapes = {tuple(r[spec.name].shape[1:]) for r in traffic.requests}
        dims = [Axis(min(s[i] for s in shapes), max(s[i] for s in shapes)) for i in range(len(spec.axes))]
        text = "x".join(map(str, dims))
        per_input.append({"name": spec.name, "dtype": spec.dtype.name, "dims": text or "scalar", "shapes": len(shapes),
                          "input_flag": f"--input {spec.name}:{spec.dtype.name}:{text}"})
    return TrafficCheck(str(path), against, summary, per_input, notes)


def describe_traffic(check: TrafficCheck) -> list[str]:
    """The lines `traffic` prints: the requests and where they were checked, the trace's figures, the inputs, the histogram."""
    s = check.summary
    lines = [f"{check.file}: {s.requests} request{'s' if s.requests != 1 else ''}, {len(s.histogram)} shape{'s' if len(s.histogram) != 1 else ''}; "
             f"checked against {check.checked_against}"]
    lines.append(f"  arrivals: {s.describe_trace()}" if s.is_trace else
                 "  arrivals: no timestamps (a rate is measured with --arrivals poisson or constant)")
    for i in check.inputs:
        lines.append(f"  input {i['name']}: {i['dtype']}, dims {i['dims']} (without the batch axis), {i['shapes']} shape{'s' if i['shapes'] != 1 else ''}"
                     f"  ({i['input_flag']})")
    lines.append("  request shape" + " " * 30 + "requests  share")
    for label, count in s.histogram:
        lines.append(f"  {label:<43} {count:>8}  {100 * count / max(1, s.requests):>4.0f}%")
    lines += [f"  note: {n}" for n in check.notes]
    return lines


def _model_signature(model: str, specs: list[Any]) -> Signature:
    """MODEL's inputs as export sees them (names and dtypes from the model, --input on top); no reference run."""
    from optimizer.model.reference import inferred_inputs
    from optimizer.model.signature import merge_specs
    from optimizer.model.source import load_model

    loaded = load_model(model)
    names, inferred = inferred_inputs(loaded, True)
    return Signature(merge_specs(inferred, names, specs, {}, optional=loaded.optional_forward_names))


def _file_signature(entries: list[Any], where: str) -> tuple[Signature, list[str]]:
    """A signature the file itself implies: its input names (the first entry's, in order), each one's dtype from its
    values and each axis's range over every entry; the reader then checks every entry against it."""
    first = entries[0]
    if not isinstance(first, dict):
        raise TrafficError(f"{where} entry 0 is not an object; {FORMAT_HINT}.")
    specs, guessed = [], []
    for name in (n for n in first if n != "timestamp"):
        shapes, kinds = [], set()
        for k, entry in enumerate(entries):
            value = entry.get(name) if isinstance(entry, dict) else None
            if value is None:
                continue  # the reader names the entry that misses it
            shape, kind = _shape_and_kind(value, f"{where} entry {k} input {name!r}")
            shapes.append(shape)
            kinds.add(kind)
            if kind.startswith("b64:"):
                guessed.append(name)
        if not shapes:
            continue
        # the widest kind its entries hold: one float makes the input float32 (the reader then checks every entry)
        dtype = next((k for k in ("float32", "int64", "bool") if k in kinds), sorted(kinds)[0])
        rank = len(shapes[0])
        bad = next((s for s in shapes if len(s) != rank), None)
        if bad is not None:
            raise TrafficError(f"{where}: input {name!r} has shapes of {rank} and {len(bad)} dims ({list(shapes[0])} and {list(bad)}); "
                               "every entry of an input has the same number of dims (without the batch axis).")
        if any(0 in s for s in shapes):
            raise TrafficError(f"{where}: input {name!r} has a dim of size 0 in some entry; every request holds at least one value on each dim.")
        axes = tuple(Axis(min(s[i] for s in shapes), max(s[i] for s in shapes)) for i in range(rank))
        specs.append(TensorSpec(name, DTYPES[dtype.removeprefix("b64:")], axes))
    if not specs:
        raise TrafficError(f"{where} entry 0 names no input; {FORMAT_HINT}.")
    return Signature(tuple(specs)), sorted(set(guessed))


def _shape_and_kind(value: Any, at: str) -> tuple[tuple[int, ...], str]:
    """An entry's input: its shape (given, or a flat list's length) and the dtype its values suggest."""
    shape = value.get("shape") if isinstance(value, dict) else None
    content = value.get("content", {"b64": value["b64"]} if "b64" in value else None) if isinstance(value, dict) else value
    if shape is not None and not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise TrafficError(f"{at}: \"shape\" {shape!r} is not a list of sizes; give the dims without the batch axis, e.g. [36].")
    if isinstance(content, dict) and "b64" in content:
        if shape is None:
            raise TrafficError(f"{at} has b64 content and no \"shape\"; give each entry's \"shape\" (without the batch axis).")
        try:
            size = len(base64.b64decode(content["b64"], validate=True))
        except (binascii.Error, TypeError, ValueError) as err:
            raise TrafficError(f"{at}: \"b64\" is not base64 ({err}); encode the array's little-endian bytes.") from err
        count = math.prod(shape)
        itemsize = size // count if count and size % count == 0 else 0
        if itemsize not in B64_DTYPES:
            raise TrafficError(f"{at}: {size} bytes of b64 content do not make shape {shape} of any 1, 2, 4 or 8-byte dtype; "
                               "make the content and the shape agree.")
        return tuple(shape), f"b64:{B64_DTYPES[itemsize]}"
    if not isinstance(content, list):
        raise TrafficError(f"{at}: \"content\" is neither a list nor {{\"b64\": ...}}; {FORMAT_HINT}.")
    flat: list[Any] = []
    stack = [content]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        else:
            flat.append(item)
    if any(isinstance(v, str) for v in flat):
        raise TrafficError(f"{at} holds text; check a text model's traffic against it (MODEL, or --input NAME:DTYPE:DIMS).")
    kind = ("bool" if flat and all(isinstance(v, bool) for v in flat) else
            "int64" if all(isinstance(v, int) and not isinstance(v, bool) for v in flat) else "float32")
    return (tuple(shape) if shape is not None else (len(flat),)), kind
