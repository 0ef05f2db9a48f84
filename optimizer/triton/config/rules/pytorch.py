"""The PyTorch backend: tensor names it binds for pytorch_libtorch and can address for torch_aoti."""

from __future__ import annotations

import re
from typing import Any

from optimizer.triton.config.rules.base import LIBTORCH, LIBTORCH_NAMED, ArtifactFacts, RuleViolation, platform_of

_LIBTORCH_OUTPUT = re.compile(r"^.+__\d+$")
_AOTI_INPUT = re.compile(r"^(INPUT__\d+|ARGS\[[^\[\]]+\](\[[^\[\]]+\])*|KWARGS\[[^\[\]]+\](\[[^\[\]]+\])*)$")
_AOTI_OUTPUT = re.compile(r"^(OUTPUT__\d+|RESULT(\[[^\[\]]+\])*)$")


def libtorch_names(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """PyTorch backend: outputs not named <name>__<index> bind by config order (a warning)."""
    # PyTorch backend since pytorch_backend ff103c4 (2022-05; every release we target): other names load and bind in config order
    # (NamingConvention STRICT_CONFIG_ORDERING), with a warning when a name has "__" and no index. The refusal "does not follow
    # naming convention i.e. <name>__<index>." is gone, so this only warns; our stand-in backend binds the same way.
    if platform_of(config) not in LIBTORCH_NAMED:  # backend "pytorch" alone is pytorch_libtorch
        return []
    odd = [t.name for t in config.output if not _LIBTORCH_OUTPUT.match(t.name)]
    if not odd:
        return []
    return [RuleViolation("libtorch_names", LIBTORCH, f"output '{odd[0]}' does not follow the <name>__<index> naming convention",
                          "list outputs in the order forward() returns them, or name them output__0, output__1, ... (--output-names)",
                          warn=True, when="loads it and binds every output by its position in the config")]


def torch_aoti_names(config: Any, facts: ArtifactFacts) -> list[RuleViolation]:
    """PyTorch backend: torch_aoti tensors use the names the backend can address."""
    if config.platform != "torch_aoti":
        return []
    out = [RuleViolation("torch_aoti_names", LIBTORCH, f"input '{t.name}' is not addressable in a torch_aoti model: the PyTorch backend names "
                         "inputs INPUT__<index>, ARGS[<i>] or KWARGS[<name>]", "name inputs INPUT__0, INPUT__1, ...")
           for t in config.input if not _AOTI_INPUT.match(t.name)]
    out += [RuleViolation("torch_aoti_names", LIBTORCH, f"output '{t.name}' is not addressable in a torch_aoti model: the PyTorch backend names "
                          "outputs OUTPUT__<index> or RESULT[...]", "name outputs OUTPUT__0, OUTPUT__1, ... (--output-names)")
            for t in config.output if not _AOTI_OUTPUT.match(t.name)]
    return out
