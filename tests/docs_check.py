"""What the docs test checks in a page: its fences, read by Sybil, and its tables, read by markdown-it.

- bash / console fences: every `aitune-export ...` command (also inside `make export ARGS=...` and a quoted `sh -c`) is
  parsed by the real click commands, in-process: the options exist on that command, their values pass click's types,
  group options stand before the subcommand. An export's flag values are read as `ExportSettings` and its cheap checks
  (input specs, value ranges, backend names, the load) run too.
- python fences: compiled; every `optimizer` import resolves and every call of an `optimizer` name binds to its
  signature (an export's keywords are `ExportSettings` fields). A block that needs only the standard library, numpy and
  `optimizer`, and runs no export, is run (in the page's namespace, in a scratch folder).
- toml fences: parsed, and accepted by the settings loader (a fleet plan by the plan loader).
- json fences: parsed, unless they elide with `...`.
- `<!-- skip: next if(not cli_has("export", "--rate"), reason="...") -->` (Sybil's skip directive) leaves out the next
  fence while an option has not landed; once it has, the fence is checked like any other.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import shlex
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from unittest import SkipTest

import click
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser

PROGRAM = "aitune-export"
RUN_IMPORTS = set(sys.stdlib_module_names) | {"numpy", "optimizer"}
"""A python fence whose imports are all among these (and that runs no export) is run, not only checked."""


def cli_has(command: str, option: str | None = None) -> bool:
    """Whether `aitune-export COMMAND` exists and has OPTION (for skip directives of fences that wait for it to land)."""
    from optimizer.cli.commands import main

    cmd = main.commands.get(command)
    return cmd is not None and (option is None or any(option in p.opts or option in p.secondary_opts for p in cmd.params))


# --- commands -------------------------------------------------------------------------------------------------------


def _shell_words(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def commands_in(source: str) -> list[list[str]]:
    """The argument lists of every aitune-export command in shell text (continuations joined, comments dropped)."""
    found: list[list[str]] = []
    for line in source.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("$ "):  # a console transcript: the prompt's line is the command
            line = line[2:]
        elif line.startswith(("#", "[")) or not line:
            continue
        try:
            words = _shell_words(line)
        except ValueError:  # not shell (an output line with a stray quote)
            continue
        found += _commands_in_words(words)
    return found


def _commands_in_words(words: list[str]) -> list[list[str]]:
    found, current = [], []
    for word in [*words, ";"]:
        if word in ("|", "||", "&&", ";", "&", "(", ")"):
            found += _command_of(current)
            current = []
        else:
            current.append(word)
    return found


def _command_of(words: list[str]) -> list[list[str]]:
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value before the command
        words = words[1:]
    nested = [c for w in words[1:] if f"{PROGRAM} " in w for c in commands_in(w)]  # sh -c '... aitune-export ...'
    if words and Path(words[0]).name == PROGRAM:
        return [[w for w in words[1:] if w != "..."], *nested]  # `...`: "the options shown above"
    if words[:2] == ["make", "export"]:  # the Makefile runs `aitune-export export --overwrite $(ARGS)`
        args = next((w[len("ARGS="):] for w in words[2:] if w.startswith("ARGS=")), "")
        return [["export", "--overwrite", *shlex.split(args)], *nested]
    return nested


def check_command(args: list[str]) -> None:
    """Parse one aitune-export command line with the real click commands; raise AssertionError naming what is wrong."""
    from optimizer.cli.commands import main

    shown = " ".join([PROGRAM, *args])
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            with main.make_context(PROGRAM, list(args)) as group:
                rest = [*group._protected_args, *group.args]
                if not rest:
                    raise AssertionError(f"{shown!r} names no command")
                name, command, rest = main.resolve_command(group, rest)
                with command.make_context(name, rest, parent=group) as ctx:
                    if name in ("export", "inspect"):
                        _check_export_values(ctx.params)
    except click.exceptions.Exit:  # --help, --version
        return
    except click.ClickException as err:
        raise AssertionError(f"{shown!r}: {err.format_message()}") from None
    except AssertionError:
        raise
    except Exception as err:  # a value the settings refuse (SettingsError and its kin)
        raise AssertionError(f"{shown!r}: {type(err).__name__}: {err}") from None


def _check_export_values(params: dict[str, Any]) -> None:
    """The checks `export` makes of its flags alone (what needs no model, file or machine)."""
    from optimizer.cli.commands import settings_from_cli
    from optimizer.model.signature import parse_input_spec, parse_value_range
    from optimizer.tune_strategy.multi_backend_strategy import check_backend_names

    options = {k: v for k, v in params.items() if k not in ("model", "config", "as_json")}
    settings = settings_from_cli(params.get("model"), None, options)
    check_backend_names(settings.backend)
    for spec in settings.input:
        parse_input_spec(spec)
    for spec in settings.value_range:
        parse_value_range(spec)
    settings.check_serving()


def check_shell(example: Example) -> None:
    problems = []
    for args in commands_in(example.parsed):
        try:
            check_command(args)
        except AssertionError as err:
            problems.append(str(err))
    if problems:
        raise AssertionError("; ".join(problems))


# --- python, toml, json -----------------------------------------------------------------------------------------------


def check_python(example: Example) -> None:
    source = example.parsed
    tree = ast.parse(source, filename=example.path)
    code = compile(tree, example.path, "exec")
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    _check_optimizer_calls(tree)
    runs_export = "export(" in source
    if imported <= RUN_IMPORTS and not runs_export:
        namespace = example.namespace
        namespace.setdefault("__name__", "docs_snippet")  # a `__main__` guard's body is the user's script run, not this
        exec(code, namespace)


def _check_optimizer_calls(tree: ast.AST) -> None:
    """`import optimizer` / `from optimizer... import X` resolve; `optimizer.NAME(...)` binds to NAME's signature."""
    import importlib

    import optimizer
    from optimizer.settings import ExportSettings

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "optimizer":
            module = importlib.import_module(node.module)
            missing = [a.name for a in node.names if not hasattr(module, a.name)]
            assert not missing, f"from {node.module} import {', '.join(missing)}: no such name"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "optimizer":
            name = node.func.attr
            assert name in optimizer.__all__, f"optimizer.{name} is not part of the API (optimizer.__all__)"
            target = getattr(optimizer, name)
            keywords = {k.arg for k in node.keywords if k.arg}
            settings_fields = {f.name for f in fields(ExportSettings)}
            if name == "export":  # its **options are ExportSettings fields
                own = set(inspect.signature(target).parameters) - {"options"}
                unknown = keywords - own - settings_fields
            else:
                try:
                    inspect.signature(target).bind_partial(*[None] * len(node.args), **{k: None for k in keywords})
                    unknown = set()
                except TypeError as err:
                    raise AssertionError(f"optimizer.{name}(...): {err}") from None
            assert not unknown, f"optimizer.{name}(...) takes no {', '.join(sorted(unknown))}"


def check_toml(example: Example) -> None:
    from optimizer.fleet.plan import load_plan
    from optimizer.settings import load_settings_file, settings_from

    data = tomllib.loads(example.parsed)
    with tempfile.TemporaryDirectory() as tmp:
        name = "pyproject.toml" if "tool" in data else "export.toml"
        path = Path(tmp) / name
        path.write_text(example.parsed)
        if "models" in data:
            load_plan(path)
        else:
            settings_from(load_settings_file(path))


def check_json(example: Example) -> None:
    if "..." not in example.parsed:
        json.loads(example.parsed)


CHECKS = {"bash": check_shell, "console": check_shell, "python": check_python, "toml": check_toml, "json": check_json}
"""The fences checked, by language; other fences (text, yaml, protobuf, markdown) are shown output or outside files."""
SYBIL = Sybil(parsers=[SkipParser(), *(CodeBlockParser(language, check) for language, check in CHECKS.items())])


@dataclass
class PageCheck:
    """What one page's fences came to."""

    checked: int = 0
    skipped: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check_page(path: Path, scratch: Path) -> PageCheck:
    """Evaluate every fence of a page in order (one namespace per page, so a fence may use an earlier one's names)."""
    import os

    document = SYBIL.parse(path)
    document.namespace.update(cli_has=cli_has)
    found = PageCheck()
    here = Path.cwd()
    os.chdir(scratch)
    try:
        for example in document:
            try:
                example.evaluate()
                found.checked += example.region.evaluator in CHECKS.values()  # a skip directive is an example too
            except SkipTest as skip:
                found.skipped.append(f"line {example.line}: {skip}")
            except Exception as err:  # every problem of the page, not only the first
                found.problems.append(f"{path.name}:{example.line}: {type(err).__name__}: {err}")
    finally:
        os.chdir(here)
    return found
