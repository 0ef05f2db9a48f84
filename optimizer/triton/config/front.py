"""One client contract whatever backend wins: a named ensemble in front of a positional model.

Clients send the `forward()` argument names and read `output__<i>` (or the user's --output-names),
whichever backend the export chose. TorchScript (`pytorch_libtorch`) accepts forward-argument input
names and `<name>__<i>` output names natively. `torch_aoti` does not: from Triton 26.05 its PyTorch
backend names tensors from the PT2 call spec (`INPUT__<i>`/`OUTPUT__<i>`, or `ARGS[i]`, `KWARGS[name]`,
`RESULT`), never the bare argument name (pytorch_backend's README from r26.05). Such a model is published
under a derived name (`<name>__positional`) with its positional config, and the public name is an
ensemble (platform "ensemble", built into Triton's core, no backend) with one step that maps the public
names onto the positional ones. `--io-names positional` publishes the bare model instead.

The ensemble's version folders hold a small marker file: object storage has no empty folders, and
Triton needs a version folder to serve an ensemble.

What a published export consists of is read back by optimizer.triton.repository.exports.
"""

from __future__ import annotations

from typing import Any

IO_NAMES = ("names", "positional")
"""--io-names: names (the contract: forward-argument names and output__<i>, an ensemble where needed); positional: the bare model."""

INNER_SUFFIX = "__positional"
VERSION_MARKER = "ensemble.txt"
VERSION_MARKER_TEXT = b"This version folder belongs to an ensemble (platform \"ensemble\"): it has no model file of its own.\n"


def inner_name(name: str) -> str:
    """The repository name of the positional model behind the public ensemble `name`."""
    return f"{name}{INNER_SUFFIX}"


def needs_front(renamed: dict[str, str], io_names: str) -> bool:
    """Whether a model whose config renames tensors (config name -> forward name) is published behind an ensemble."""
    return io_names == "names" and any(k != v for k, v in renamed.items())


def front_config(inner: Any, name: str, inner_model: str, renamed: dict[str, str]) -> Any:
    """The ensemble `name` that serves `inner` (a parsed ModelConfig) under the forward names.

    Args:
        inner: the positional model's config (its tensors, dims, dtypes and max_batch_size are copied).
        inner_model: the positional model's repository name (the step's model_name).
        renamed: the inner config's tensor name -> the public (forward/output) name; names not in it are kept.
    """
    config = type(inner)()
    config.name = name
    config.platform = "ensemble"
    config.max_batch_size = inner.max_batch_size
    if inner.HasField("version_policy"):
        config.version_policy.CopyFrom(inner.version_policy)
    step = config.ensemble_scheduling.step.add(model_name=inner_model, model_version=-1)
    for src, dst, mapping in ((inner.input, config.input, step.input_map), (inner.output, config.output, step.output_map)):
        for tensor in src:
            public = renamed.get(tensor.name, tensor.name)
            copy = dst.add()
            copy.CopyFrom(tensor)
            copy.name = public
            mapping[tensor.name] = public
    return config


def front_step(config: Any) -> str | None:
    """The model an ensemble of ours serves (its one step), or None when `config` is not a one-step ensemble."""
    if config.platform != "ensemble" or len(config.ensemble_scheduling.step) != 1:
        return None
    return config.ensemble_scheduling.step[0].model_name
