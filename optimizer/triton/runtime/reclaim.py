"""Nothing of a local tritonserver outlives it, even when it dies hard: a record per running server, a watcher that
clears its leftovers the moment it dies, and a reclaim, at the next start, of what an earlier run's record names.

Why: the python backend's stubs are children of tritonserver in its process group. When the server is SIGKILLed or
crashes (a CI runner ending a job with its children, the OOM killer) they are reparented to init, ignore SIGTERM, and
keep their memory, a share of a core and their /dev/shm regions until the machine reboots. Nothing inside the run's
process tree survives such a kill, so two pieces live outside it:
- the watcher, detached from the run (forked twice, its own session), waits on the server's pidfd; when the server
  exits it kills what is left of the server's process group and removes the server's regions, then exits;
- the record, a JSON file per server under <server homes>/.running, lets the next server start reclaim what a watcher
  killed along with everything else could not (the record's owner or server is gone: the run is over).
Only processes in the recorded process group whose executable lies in the recorded server home are killed (and none
once the group's id names another process, or the record comes from another boot or pid namespace, as with a cache
folder shared between containers), and only regions with the recorded per-server prefix are removed: a user's own
tritonserver is never touched.

Standard library only: the watcher runs this file as a script (`python -I -S reclaim.py RECORD`), without the package.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RUNNING_DIR = ".running"
"""The folder, beside the server homes, that holds one record per server started from them."""
SHM_DIR = Path("/dev/shm")
KILL_WAIT_S = 10.0  # how long a SIGKILLed leftover may take to go (a stub unmapping a large model)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks since boot) of a process, None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name in (...) may hold spaces
    return fields[0], int(fields[2]), int(fields[19])


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot): with the pid, names one process even after the pid is reused."""
    stat = _stat(pid)
    return stat[2] if stat else None


def pid_scope() -> tuple[str, str]:
    """This boot and pid namespace: a record made under others names processes this machine cannot judge."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return boot, namespace


def running(pid: int, started: int) -> bool:
    """Whether the process `pid` that started at `started` still runs (a zombie has ended)."""
    stat = _stat(pid)
    return stat is not None and stat[2] == started and stat[0] not in ("Z", "X")


@dataclass
class ServerRecord:
    """What a later run needs to find one server's leftovers and tell them from anything else."""

    server_pid: int  # also its process group: it starts its own session
    server_start: int
    owner_pid: int  # the process that started it (the export, validate, serve)
    owner_start: int
    home: str  # the server home (resolved): the executables of the server and its stubs lie in it
    shm_prefix: str
    log: str
    started_at: float  # time.time()
    boot: str  # pid_scope(): the boot and pid namespace the pids belong to
    namespace: str

    def path(self, running_dir: Path) -> Path:
        """Its file: named by the server's pid and start time, so two records never share one."""
        return running_dir / f"{self.server_pid}-{self.server_start}.json"

    def over(self) -> bool:
        """The run is over: its owner or its server has ended."""
        return not running(self.owner_pid, self.owner_start) or not running(self.server_pid, self.server_start)


def write_record(running_dir: Path, record: ServerRecord) -> Path:
    """Write `record` atomically (a reader never sees half of one); returns its path."""
    running_dir.mkdir(parents=True, exist_ok=True)
    path = record.path(running_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record)))
    os.replace(tmp, path)
    return path


def read_record(path: Path) -> ServerRecord | None:
    """The record in `path`, None when it is unreadable (half-written by a process killed mid-write, an older format)."""
    try:
        return ServerRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def leftovers(record: ServerRecord) -> list[int]:
    """Live processes of the record's server: in its process group, running an executable from its home."""
    leader = _stat(record.server_pid)
    if leader is not None and leader[2] != record.server_start:  # the group's id now names another process: not ours
        return []
    home = os.path.realpath(record.home) + "/"  # /proc/PID/exe is a resolved path
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is None or stat[1] != record.server_pid or stat[0] in ("Z", "X"):
            continue
        try:
            exe = os.readlink(entry / "exe")
        except OSError:
            continue
        if exe.startswith(home):
            found.append(int(entry.name))
    return sorted(found)


def clear(record: ServerRecord) -> tuple[list[int], list[str]]:
    """SIGKILL the record's leftover processes (the stubs ignore SIGTERM), wait until they are gone, remove its regions.

    Returns the pids killed and the regions removed.
    """
    pids = leftovers(record)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + KILL_WAIT_S
    while leftovers(record) and time.monotonic() < deadline:
        time.sleep(0.05)
    regions = sorted(SHM_DIR.glob(f"{record.shm_prefix}*")) if record.shm_prefix else []
    for region in regions:
        region.unlink(missing_ok=True)
    return pids, [r.name for r in regions]


def reclaim(running_dir: Path) -> list[str]:
    """Clear the leftovers of every recorded server whose run is over; one warning line per run that left something.

    A record whose owner and server still run is another live run's: it is left alone. Returns the lines logged.
    """
    lines, scope = [], pid_scope()
    try:
        paths = sorted(running_dir.glob("*.json")) if running_dir.is_dir() else []
    except OSError as err:  # an unreadable cache folder must not stop a server from starting
        log.warning("could not look for an earlier run's tritonserver leftovers in %s: %s", running_dir, err)
        paths = []
    for path in paths:
        record = read_record(path)
        if record is None:
            log.warning("removing an unreadable server record %s", path)
            path.unlink(missing_ok=True)
            continue
        if (record.boot, record.namespace) != scope:
            if record.boot != scope[0]:  # an earlier boot: nothing of it runs, and /dev/shm was emptied
                path.unlink(missing_ok=True)
            continue  # another pid namespace: that container's own next run reclaims it
        if not record.over():
            continue
        pids, regions = clear(record)
        path.unlink(missing_ok=True)
        if pids or regions:
            line = (f"reclaimed what an earlier run's tritonserver left (server pid {record.server_pid}, started by pid "
                    f"{record.owner_pid} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record.started_at))}, log "
                    f"{record.log}): killed {len(pids)} process(es) {pids or ''}, removed {len(regions)} shared-memory "
                    f"region(s) {regions or ''}")
            log.warning("%s", line)
            lines.append(line)
    return lines


def start_watcher(record_path: Path) -> None:
    """Start the watcher of the server `record_path` names; it detaches at once, so this returns in milliseconds."""
    subprocess.run([sys.executable, "-I", "-S", __file__, str(record_path)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, cwd="/", start_new_session=True, check=False, timeout=60)


def _wait_for_exit(pid: int, started: int) -> None:
    """Block until the process ends: its pidfd turns readable then (a zombie counts); polling where there is no pidfd."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            if running(pid, started):  # the pidfd names the recorded process, not a successor with its pid
                select.select([fd], [], [])
            return
        finally:
            os.close(fd)
    while running(pid, started):
        time.sleep(0.5)


def _watch(record_path: Path) -> None:
    """The watcher: detach, wait for the server to end, clear its leftovers, drop its record, note it in the server log."""
    if os.fork():  # the caller's child exits now: this process leaves the run's tree (a kill of it "with children" misses it)
        os._exit(0)
    record = read_record(record_path)
    if record is None:
        return
    _wait_for_exit(record.server_pid, record.server_start)
    pids, regions = clear(record)
    record_path.unlink(missing_ok=True)
    if pids:  # the owner, if alive, learns from the server log why its stubs are gone (a log already removed stays so)
        try:
            fd = os.open(record.log, os.O_WRONLY | os.O_APPEND)
        except OSError:
            return
        with os.fdopen(fd, "a") as out:
            out.write(f"aitune-export watcher: tritonserver pid {record.server_pid} ended; killed its leftover processes {pids}"
                      f" and removed {len(regions)} shared-memory region(s)\n")


if __name__ == "__main__":
    _watch(Path(sys.argv[1]))
