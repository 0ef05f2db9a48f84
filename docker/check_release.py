"""Refuse to serve a repository exported by a different NGC release than this server's.

A TensorRT plan only loads on the TensorRT version that built it; the export records the NGC
release and library versions in report.json, this script compares them with the server image.
Usage: python3 check_release.py REPORT.json   (exit 0: match, 1: mismatch, 2: unreadable report)
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    try:
        result = json.load(open(argv[1]))["result"]
        env = result["environment"]
        published = next((c["backend"] for c in result["candidates"] if c["name"] == result["selected"]), "")
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        print(f"check_release: cannot read the export's report ({err}); copy report.json from the export stage.", file=sys.stderr)
        return 2
    exported = env.get("ngc", {})
    problems = []
    release_built = exported.get("NVIDIA_PYTORCH_VERSION")
    release_here = os.environ.get("NVIDIA_TRITON_SERVER_VERSION")
    if release_built and release_here and release_built != release_here:
        problems.append(f"the export ran in NGC PyTorch {release_built} but this is NGC Triton {release_here}")
    trt_built, trt_here = exported.get("TENSORRT_VERSION"), os.environ.get("TENSORRT_VERSION")
    uses_trt = published in ("tensorrt", "onnxruntime-trt")
    if trt_built and trt_here and trt_built != trt_here:
        problems.append(f"TensorRT {trt_built} built the artifacts but the server has TensorRT {trt_here}"
                        + ("" if uses_trt else " (no TensorRT plan was published, so this is only a warning)"))
        if not uses_trt:
            print("check_release: warning: " + problems.pop(), file=sys.stderr)
    if problems:
        print("check_release: " + "; ".join(problems) + ". Build both stages from one --build-arg RELEASE.", file=sys.stderr)
        return 1
    print(f"check_release: export {release_built or 'unknown'} / server {release_here or 'unknown'}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
