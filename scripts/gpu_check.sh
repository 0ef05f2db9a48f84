#!/usr/bin/env bash
# The GPU check, for one NVIDIA GPU, in under 5 minutes: export the bundled examples with --device cuda,
# print one line per candidate (TensorRT when it imports, otherwise its real reason), then run
# tests/test_gpu.py. The rest of the suite runs on CPU-only machines: this is where the CUDA code runs.
#
#   scripts/gpu_check.sh                 run the check; work files go to $GPU_CHECK_DIR (/tmp/aitune-gpu-check)
#   scripts/gpu_check.sh --fetch-wheels  on a machine with PyPI: save into .whl/ the wheels an offline GPU
#                                        machine lacks (tritonclient, python-rapidjson, polygraphy; for Python $GPU_PY)
#
# It makes its own environment: a venv on top of $PYTHON (default python3) that reuses the CUDA torch,
# onnx and onnxruntime already installed there, completed from PyPI when PyPI answers (torch with CUDA,
# the project's extras, onnxruntime-gpu and tensorrt, each allowed to fail) or from .whl/ when it does not.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WORK=${GPU_CHECK_DIR:-/tmp/aitune-gpu-check}
GPU_PY=${GPU_PY:-3.12}
OFFLINE=(tritonclient==2.51.0 python-rapidjson polygraphy==0.53.6)
T0=$(date +%s)
say() { printf '== %s (%ss)\n' "$*" "$(( $(date +%s) - T0 ))"; }

if [ "${1:-}" = "--fetch-wheels" ]; then
  mkdir -p .whl
  exec "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "${OFFLINE[@]}"
fi

say "environment"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
mkdir -p "$WORK"
[ -x "$WORK/venv/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$WORK/venv" || exit 1
PY="$WORK/venv/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check)
# Is the package index reachable? Ask pip itself (it knows the configured index, mirrors and proxies included).
if timeout 30 "$PY" -m pip index versions pip --disable-pip-version-check >/dev/null 2>&1; then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null || "${PIP[@]}" "${TORCH_SPEC:-torch}"
  "${PIP[@]}" -e ".[onnx,tensorrt]" || exit 1
  "${PIP[@]}" onnxruntime-gpu || echo "onnxruntime-gpu did not install; the ONNX Runtime GPU candidates will say why"
  "${PIP[@]}" tensorrt || echo "tensorrt did not install; the tensorrt candidate will say why"
else
  echo "PyPI is not reachable: using the packages here plus .whl/ (scripts/gpu_check.sh --fetch-wheels makes it)"
  ls .whl/*.whl >/dev/null 2>&1 && "${PIP[@]}" --no-index --no-deps .whl/*.whl
  "${PIP[@]}" --no-index --no-deps --no-build-isolation -e . || exit 1
fi
"$PY" - <<'EOF' || exit 1
import importlib, torch
print(f"torch {torch.__version__} cuda={torch.version.cuda} gpus={torch.cuda.device_count()}")
assert torch.cuda.is_available(), "torch sees no GPU: nothing to check"
for m in ("onnxruntime", "tensorrt", "polygraphy", "tritonclient.grpc"):
    try:
        mod = importlib.import_module(m)
        extra = f" providers={mod.get_available_providers()}" if m == "onnxruntime" else ""
        print(f"{m} {getattr(mod, '__version__', '')}{extra}")
    except Exception as err:
        print(f"{m}: {type(err).__name__}: {err}")
EOF
CLI=("$PY" -m optimizer.cli)

say "backends on cuda"
"${CLI[@]}" backends --device cuda --check-imports
"${CLI[@]}" backends --device cuda --check-imports --precision fp16 | grep -E "^(tensorrt|onnxruntime-trt|torchscript) "

summary() {  # one line per candidate of a finished run: status, then its best throughput or its reason
  "$PY" - "$1" <<'EOF'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except OSError:
    sys.exit(f"   no report at {sys.argv[1]}")
r = report["result"]
for c in ([r["eager"]] if r.get("eager") else []) + r["candidates"]:
    d, meta = c.get("decision") or {}, (c.get("artifact") or {}).get("metadata", {})
    if c["status"] == "passed" and d.get("profiles"):
        best = max(d["profiles"], key=lambda p: p["throughput"])
        extra = f" engine_max_batch={meta['engine_max_batch']}" if "engine_max_batch" in meta else ""
        print(f"   {c['name']:<24} passed  {best['throughput']:>10.0f}/s at batch {best['batch_size']:<4} max {d['max_batch_size']}{extra}")
    else:
        print(f"   {c['name']:<24} {c['status']:<7} {c['reason'][:150]}")
print(f"   selected: {r['selected']} max_batch_size={r['max_batch_size']}")
EOF
}

export_one() {  # NAME SECONDS ARGS...: export with --device cuda, then summarize (the CLI's own lines only on failure)
  local name=$1 limit=$2; shift 2
  say "export $name"
  local log="$WORK/$name.log"
  # --allow-version-mismatch: this checks the GPU paths with whatever TensorRT is installed, not a target release
  timeout "$limit" "${CLI[@]}" -q export --device cuda --repository "$WORK/repo" --name "$name" --overwrite \
    --report-dir "$WORK/reports/$name" --build-timeout 120 --profile-timeout 45 --allow-version-mismatch "$@" >"$log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { echo "   exit status $rc; the end of $log:"; tail -n 5 "$log" | cut -c1-200; }
  summary "$WORK/reports/$name/report.json"
  [ -f "$WORK/repo/$name/config.pbtxt" ] && grep -E "^(platform|backend|max_batch_size)|kind:|gpus:" "$WORK/repo/$name/config.pbtxt" | tr '\n' ' ' && echo
}

# --max-batch-size bounds each search (and each engine's profile); --time-budget is not used because its
# one deadline is shared by every candidate, so a slow first one would leave the engines unmeasured
export_one cnn 100 --max-batch-size 32
export_one encoder 100 optimizer.examples.transformer:build --input input_ids:int64:1-128 \
  --value-range input_ids:0:999 --max-batch-size 32
export_one cnn_fp16 80 --precision fp16 --backend tensorrt --backend onnxruntime-trt --backend torchscript --max-batch-size 16

say "tests/test_gpu.py"
timeout 110 "$PY" -m pytest tests/test_gpu.py -q -p no:logging -p no:cacheprovider -rs --no-header 2>&1 | tail -n 25 | cut -c1-220
say "done"
