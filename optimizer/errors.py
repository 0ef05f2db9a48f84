"""User-facing error types: the CLI prints their message as one line, with no traceback.

`UsageError` subclasses mean bad input (exit status 2); `CheckFailed` subclasses mean good
input on which a check failed (exit status 1). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class OptimizerError(Exception):
    """Base of every error the CLI reports as a single line."""

    exit_code = 1


class UsageError(OptimizerError):
    """Bad input: a model source, a spec, a name, a path or a settings file."""

    exit_code = 2


class ModelLoadError(UsageError):
    """MODEL could not be turned into something to optimize."""


class SignatureError(UsageError):
    """An --input / --output-names / --value-range / --samples spec is malformed or contradicts the model."""


class TrafficError(UsageError):
    """A --traffic file (perf_analyzer --input-data JSON) is unreadable or does not fit the model's signature."""


class SettingsError(UsageError):
    """An option value or a settings file entry is invalid."""


class PublishError(UsageError):
    """The model repository or model name cannot be written as asked."""


class RepositoryError(UsageError):
    """`validate` was pointed at something it cannot validate: REPO is not a model repository, or --model is unknown."""


class TemplateError(UsageError):
    """A config.pbtxt template fails to render or does not parse as Triton's ModelConfig."""


class ServerError(UsageError):
    """The Triton given with --url cannot run the served search: unreachable, not in explicit model-control mode, or gone."""


class CheckFailed(OptimizerError):
    """Good input on which a check failed: no candidate passed, a rule or a validation failed."""

    exit_code = 1


class BackendError(CheckFailed):
    """A backend could not build, load or run an artifact."""


class NoCandidateError(CheckFailed):
    """No candidate backend produced a deployable, correct artifact."""


class ConfigRuleError(CheckFailed):
    """A rendered config.pbtxt breaks one of Triton's load-time rules."""


class ValidationError(CheckFailed):
    """The published repository failed to load, answer correctly or be measured in Triton."""


class Interrupted(OptimizerError):
    """The run was stopped by Ctrl-C or SIGTERM; partial results are where the message says."""

    exit_code = 130


def first_line(err: BaseException) -> str:
    """An exception as one line for a candidate's reason: its type and the first line of its message."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__
