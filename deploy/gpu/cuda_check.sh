#!/usr/bin/env bash
# CUDA check on a GPU host whose Python already has CUDA torch and transformers (no network, no
# venv of ours): tests/gpu compares the TorchEngine update (float32 and bfloat16), its
# checkpoint, the checkpoint's CUDA RNG state and the hf rollout engine on the GPU with the CPU,
# and the DeepSpeed engine (ZeRO-2 and ZeRO-3, one process, nccl) with TorchEngine on the GPU.
#
#   deploy/gpu/cuda_check.sh [PYTEST_ARGS]   # $OUT (optional) gets the log; PY=python (default
#                                            # /opt/torch/.venv/bin/python3, else python3)
#
# Python packages dart needs beyond the host's come as wheels in .whl/, installed into /tmp/site:
# fastavro (dart.events imports it), deepspeed (pure Python, zipped from our venv: no op is
# prebuilt, none is built: the engine uses torch's AdamW) and what it imports that the host lacks
# (pydantic, pydantic-core, annotated-types, typing-inspection, hjson; typing-extensions, which
# pydantic needs at >= 4.16, only where the host's is older). A wheel of a distribution the host
# already imports at its version or newer is left out. Without the deepspeed wheels its tests
# skip and say why. The pytest run ignores pyproject.toml's settings and the suite's root conftest
# (pytest-asyncio and the Kafka clients are not on the host). Figures of every test go to
# $OUT/cuda_check.jsonl. Exit status: pytest's (124: over 150 s); 2: the wheels or imports
# failed; 3: no CUDA device.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

WHEELS=${WHEELS:-.whl}
wheels=()
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  mapfile -t wheels < <("$PY" - "$WHEELS"/*.whl <<'EOF'
import importlib.metadata as md, importlib.util, os, sys
for path in sys.argv[1:]:
    name, version = os.path.basename(path).split("-")[:2]
    try:
        from packaging.version import Version
        have = md.version(name) if importlib.util.find_spec(name.lower()) else None
        if have is not None and Version(have) >= Version(version):
            print(f"cuda check: the host has {name} {have}: {os.path.basename(path)} left out", file=sys.stderr)
            continue
    except Exception:
        pass
    print(path)
EOF
)
fi
if [ ${#wheels[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" \
    || for w in "${wheels[@]}"; do "$PY" -m zipfile -e "$w" /tmp/site; done \
    || { echo "cuda check: installing ${wheels[*]} failed"; exit 2; }
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DART_GPU_CHECK_OUT=$OUT
rm -f "$OUT/cuda_check.jsonl"

nvidia-smi -L || true
"$PY" -c 'import sys, torch, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__)
print("cuda available:", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
import dart.train.engine, dart.train.checkpoint, dart.rollout.hf_engine
print("dart imports: ok")
try:
    import deepspeed, pydantic
    print("deepspeed", deepspeed.__version__, "pydantic", pydantic.VERSION, "from", deepspeed.__file__)
except Exception as err:
    print("deepspeed does not import (", err, "): its tests skip")' || { echo "cuda check: the imports failed"; exit 2; }
# Without a GPU every test would skip and pytest pass: say so and fail (DART_GPU_CHECK_DEVICE=cpu
# runs the comparisons CPU against CPU instead).
if [ "${DART_GPU_CHECK_DEVICE:-cuda}" != cpu ] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  echo "cuda check: torch sees no CUDA device: nothing checked"; exit 3
fi

timeout_opts=()
if "$PY" -c 'import pytest_timeout' 2>/dev/null; then timeout_opts=(-p pytest_timeout --timeout 90); fi
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 150 "$PY" -m pytest -c /dev/null --rootdir . --confcutdir tests/gpu \
  -p no:cacheprovider -o addopts='' ${timeout_opts[@]+"${timeout_opts[@]}"} tests/gpu -v -m gpu -rs "$@" 2>&1 | tee "$OUT/cuda_check.log"
status=${PIPESTATUS[0]}
echo "--- figures ($OUT/cuda_check.jsonl)"
cat "$OUT/cuda_check.jsonl" 2>/dev/null
echo "cuda check: pytest exit status $status"
exit "$status"
