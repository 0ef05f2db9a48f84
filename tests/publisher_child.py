"""A publisher process for the kill and concurrency tests: publishes one model through optimizer.triton.repository.atomic.

    python -m tests.publisher_child REPO NAME --payload FILE [--version N] [--overwrite] [--stop-at POINT] [--log FILE] [--tag T]

--stop-at makes the process SIGSTOP itself when it reaches that checkpoint (repository.CHECKPOINTS),
so the test can SIGKILL it exactly there. --log appends "<tag> <event>" lines (start, every
checkpoint, done). The config text names the versions the model will have, so a test can check that
it was built from the repository state seen under the lock.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

from optimizer.triton.repository import atomic as repository
from optimizer.triton.repository.atomic import ModelFiles, RepositoryState


def config_text(name: str, state: RepositoryState) -> str:
    """What the child writes as config.pbtxt (not a real config: the repository layer does not read it)."""
    return f'name: "{name}"\n# version {state.version}, versions after publishing: {list(state.versions_after)}\n'


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("name")
    ap.add_argument("--payload", required=True)
    ap.add_argument("--version", type=int)
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--stop-at")
    ap.add_argument("--log")
    ap.add_argument("--tag", default="child")
    args = ap.parse_args()

    def note(event: str) -> None:
        if args.log:
            with open(args.log, "a") as f:
                f.write(f"{args.tag} {event}\n")

    def hook(point: str) -> None:
        note(point)
        if point == args.stop_at:
            os.kill(os.getpid(), signal.SIGSTOP)

    repository.checkpoint_hook = hook
    payload = Path(args.payload)

    def build(state: RepositoryState) -> ModelFiles:
        return ModelFiles(config_text(args.name, state), {"model.onnx": payload},
                          {"warmup/image.data": f"new sample for version {state.version}".encode()})

    note("start")
    repository.publish_model(Path(args.repo), args.name, build, args.version, args.overwrite)
    note("done")


if __name__ == "__main__":
    main()
