"""Run one task in its own process: a crash, hang or memory blow-up there is a result, not our death.

The child starts a new session (so compilers it spawns die with it), sends its stdout and stderr
(including C-level output) to a log file, and writes its result as JSON. The parent waits with a
timeout; on timeout, Ctrl-C or SIGTERM it kills the child's whole process group.

Children are forked from a fork server that has imported torch once (POSIX), not spawned: a spawned
child pays seconds of CPU importing torch, and an export runs one or two children per candidate.
The server has run no torch code, so no thread pool exists yet to break in the fork; each child
takes the caller's environment and working directory of the moment, as a spawned one would.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import logging
import multiprocessing
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from optimizer.task.core_share import pin_to

log = logging.getLogger(__name__)

_LIVE_GROUPS: set[int] = set()
"""Process groups of children still running, so an interrupt handler can stop them all."""
FORK_SERVER_PRELOAD = ("torch",)
"""What the fork server imports once for every child (numpy comes with it); not Inductor, which sizes its
compile pool from the cores at import time, before a child is pinned to its own."""


@functools.cache
def _child_context() -> multiprocessing.context.BaseContext:
    """Fork server where the platform has one (Linux, macOS), else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(FORK_SERVER_PRELOAD))
        return ctx
    return multiprocessing.get_context("spawn")


def refuse_unguarded_main() -> None:
    """Refuse an export started at the top level of the caller's script, outside `if __name__ == "__main__":`.

    A fork-server or spawned child re-imports the script that started Python (multiprocessing's
    bootstrapping), so such a script would start the export again inside every child, and each child
    would die with "no result". Scripts without a file (python -c, notebooks) and `python -m pkg` run
    nothing again.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", "") or ""
    if not path or spec_name.endswith("__main__"):
        return
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__"):
        frame = frame.f_back
    if frame is None:
        return
    try:
        tree = ast.parse(Path(path).read_text(), path)
    except (OSError, SyntaxError, ValueError):
        return
    line = frame.f_lineno
    if not any(_is_main_test(n.test) and n.body[0].lineno <= line <= (n.body[-1].end_lineno or line)
               for n in ast.walk(tree) if isinstance(n, ast.If)):
        from optimizer.errors import UsageError

        raise UsageError(f"the export is started at the top level of {Path(path).name} (line {line}), outside "
                         "`if __name__ == \"__main__\":`; its measuring processes re-import that script and would start it "
                         "again. Put the call under `if __name__ == \"__main__\":`.")


def _is_main_test(test: ast.expr) -> bool:
    """`__name__ == "__main__"`, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
            and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides))


@dataclass
class ChildOutcome:
    """What came back from a child: its JSON value, or why there is none."""

    ok: bool
    value: Any = None
    reason: str = ""
    exitcode: int | None = None
    seconds: float = 0.0
    timed_out: bool = False
    signal: str = ""


def log_tail(path: Path, lines: int = 12) -> str:
    """The last lines of a log, for a failure reason."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def stop_all_children() -> None:
    """Kill every live child's process group (used on Ctrl-C / SIGTERM)."""
    for pgid in list(_LIVE_GROUPS):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _LIVE_GROUPS.discard(pgid)


def run_isolated(
    target: str,
    payload: dict[str, Any],
    workdir: Path,
    timeout_s: float | None,
    label: str,
    poll: Callable[[float], str | None] | None = None,
    cores: list[int] | None = None,
) -> ChildOutcome:
    """Call `module:function(payload)` in a child process; the function returns a JSON-serializable value.

    `poll(elapsed_s)` is called about four times a second while the child runs; a string it returns
    stops the child, with that string as the reason (per-stage timeouts use this). `cores`: the child runs on
    these CPU cores only (task/core_share.py), set before it runs anything heavy.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    job_path, result_path, log_path = workdir / f"{label}.job.json", workdir / f"{label}.result.json", workdir / f"{label}.log"
    for p in (result_path, log_path):
        p.unlink(missing_ok=True)
    job_path.write_text(json.dumps(payload))
    proc = _child_context().Process(target=_child_entry, name=label, daemon=False,
                                    args=(target, str(job_path), str(result_path), str(log_path), cores, dict(os.environ), os.getcwd()))
    t0 = time.monotonic()
    proc.start()
    _LIVE_GROUPS.add(proc.pid)  # the child calls setsid() first thing: its pgid is its pid
    timed_out = False
    stop_reason = ""
    try:
        while proc.is_alive():
            proc.join(0.25)
            elapsed = time.monotonic() - t0
            if timeout_s is not None and elapsed > timeout_s:
                stop_reason = f"timed out after {timeout_s:.0f} s"
            elif poll is not None and proc.is_alive():
                stop_reason = poll(elapsed) or ""
            if stop_reason and proc.is_alive():
                timed_out = True
                _kill_group(proc.pid)
                proc.join(10)
                break
    except BaseException:
        _kill_group(proc.pid)
        proc.join(10)
        raise
    finally:
        _LIVE_GROUPS.discard(proc.pid)
        _kill_group(proc.pid)  # grandchildren (compilers) left in the group
    seconds = time.monotonic() - t0
    code = proc.exitcode
    if timed_out:
        return ChildOutcome(False, None, f"{stop_reason} (see {log_path.name})", code, seconds, True)
    if result_path.exists():
        result = json.loads(result_path.read_text())
        if result.get("ok"):
            return ChildOutcome(True, result["value"], "", code, seconds)
        return ChildOutcome(False, result.get("value"), result.get("error", "failed"), code, seconds)
    tail = log_tail(log_path, 6)
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return ChildOutcome(False, None, f"crashed with {name}" + (f"; log ends: {tail.splitlines()[-1]}" if tail else ""), code, seconds, signal=name)
    return ChildOutcome(False, None, f"exited with status {code} and no result" + (f"; log ends: {tail.splitlines()[-1]}" if tail else ""), code, seconds)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: signal.Signals) -> Callable[[], None] | None:
    """A `preexec_fn` (Linux) that has the kernel send `sig` to the child when the thread that started it dies,
    so a killed run leaves no orphaned servers or exports behind; None elsewhere.

    prctl is looked up here, in the parent. The returned function, which runs in the forked child between fork
    and exec, only calls it: a lookup there (dlopen) can deadlock on a lock another thread held at fork time,
    and Popen then waits for an exec that never comes.
    """
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    value = int(sig)
    return lambda: prctl(_PR_SET_PDEATHSIG, value)


def _die_with_parent() -> None:
    """In a child (single-threaded, so the lookup is safe): SIGKILL when its parent (the caller or the fork
    server, which exits with the caller) dies."""
    set_signal = parent_death_signal(signal.SIGKILL)
    if set_signal is not None:
        set_signal()
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _child_entry(target: str, job_path: str, result_path: str, log_path: str, cores: list[int] | None = None,
                 environ: dict[str, str] | None = None, cwd: str | None = None) -> None:
    os.setsid()
    _die_with_parent()
    if environ is not None:  # the fork server's own are those of the moment it started
        os.environ.clear()
        os.environ.update(environ)
    if cwd is not None:
        os.chdir(cwd)
    pin_to(cores)
    if cores and "torch" in sys.modules:  # the fork server imported it before the pin: its pool must fit the pin
        sys.modules["torch"].set_num_threads(len(cores))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("torch", "onnxscript", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    payload = json.loads(Path(job_path).read_text())
    module_name, _, func_name = target.partition(":")
    try:
        value = getattr(importlib.import_module(module_name), func_name)(payload)
        result = {"ok": True, "value": value}
    except Exception as err:  # becomes the candidate's reason; the traceback stays in the log
        traceback.print_exc()
        value = getattr(err, "partial", None)
        result = {"ok": False, "error": f"{type(err).__name__}: {err}", "value": value}
    tmp = Path(result_path + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
