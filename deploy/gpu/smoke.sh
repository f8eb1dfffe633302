#!/usr/bin/env bash
# GPU smoke on a CUDA host with no network: nothing is pip-installed from an index. Two parts.
#
#   deploy/gpu/smoke.sh [--uitars DIR]     # DIR or $DART_UITARS_DIR: UI-TARS weights (optional)
#
# 1. Host part, with the host's own torch and transformers ($PY: /opt/torch/.venv/bin/python3,
#    else python3; dart's few extra packages as wheels in .whl/, see cuda_check.sh):
#    deploy/gpu/cuda_check.sh (the trainer, DeepSpeed and the hf engine on CUDA against the CPU),
#    then benchmarks/gpu_smoke.py --engine hf --device cuda (the hf engine's weight swaps on the
#    GPU, answers checked against the CPU engine's).
# 2. vLLM part, only where vLLM is installed: $VLLM_PY (default: $PY when it imports vllm, else
#    .venv-gpu/bin/python when present; make one on a host with network with
#    `pip install -c deploy/gpu/constraints.txt -e '.[gpu]'`). benchmarks/gpu_smoke.py --engine
#    vllm: the tiny model against the CPU engine, swaps, and UI-TARS in bf16 when given. Without
#    vLLM the part says so and is skipped.
# 3. GPU benchmark (BENCH=0 leaves it out): benchmarks/gpu_bench.py with $PY, at most ~6 minutes:
#    the trainer at Qwen2.5-VL 1.5B and 7B shapes (text and one screenshot per step: tokens/s,
#    MFU, peak memory), the bfloat16 update check, a 7B version's publish-to-serve path beside the
#    host's copy and disk limits; figures in $OUT/gpu_bench.json (docs/gpu.md keeps its table).
#    BENCH_ARGS adds arguments (e.g. "--engine-set KEY=VALUE" for the bf16 check's after run).
#
# DEVICE=cpu runs part 1 on the CPU (and part 3 as --tiny: the steps, no figures) (what a machine without a GPU can check: the steps, not the
# figures; cuda_check.sh only with CUDA_CHECK=1). Figures and logs go to $OUT (default: a new temporary directory). Exit status:
# 0 every part that ran passed (a skipped vLLM part is said so on the last line), 1 a part
# failed, 3 nothing could run (no CUDA device and DEVICE is not cpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-$(mktemp -d)}
export OUT
mkdir -p "$OUT"

if [ "$DEVICE" != cpu ] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  echo "gpu smoke: torch ($PY) sees no CUDA device: nothing run (DEVICE=cpu runs the host part on the CPU)"
  exit 3
fi

failed=()
echo "=== host part: $PY, device $DEVICE"
if [ "$DEVICE" = cpu ]; then
  # cuda_check's comparisons CPU against CPU outlast its 150 s limit on a small shared CPU (one of
  # its 11 tests alone took 289 s on 2 shared cores)
  if [ "${CUDA_CHECK:-0}" = 1 ]; then
    DART_GPU_CHECK_DEVICE=cpu bash deploy/gpu/cuda_check.sh || failed+=("cuda_check")
  else
    echo "cuda check: left out on the CPU (CUDA_CHECK=1 runs it CPU against CPU)"
  fi
else
  bash deploy/gpu/cuda_check.sh || failed+=("cuda_check")
fi
# cuda_check.sh put dart's extra packages (from .whl/) into /tmp/site
PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 \
  "$PY" benchmarks/gpu_smoke.py --engine hf --device "$DEVICE" --requests 8 --swaps 2 --out "$OUT/gpu_smoke_hf.json" \
  || failed+=("gpu_smoke hf")

echo "=== vLLM part"
if [ -z "${VLLM_PY:-}" ]; then
  if PYTHONPATH=/tmp/site "$PY" -c 'import vllm' 2>/dev/null; then VLLM_PY=$PY
  elif [ -x .venv-gpu/bin/python ]; then VLLM_PY=.venv-gpu/bin/python
  fi
fi
if [ -z "${VLLM_PY:-}" ]; then
  vllm_note="skipped: vLLM is not installed on this host ($PY does not import it, no .venv-gpu; set VLLM_PY)"
  echo "vLLM part: $vllm_note"
else
  vllm_note="ran ($VLLM_PY)"
  PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 \
    "$VLLM_PY" benchmarks/gpu_smoke.py --engine vllm --out "$OUT/gpu_smoke_vllm.json" "$@"
  status=$?
  if [ $status -eq 3 ]; then vllm_note="skipped (see above)"; elif [ $status -ne 0 ]; then failed+=("gpu_smoke vllm"); fi
fi

echo "=== GPU benchmark"
if [ "${BENCH:-1}" = 0 ]; then
  echo "gpu bench: left out (BENCH=0)"
else
  bench_args=()
  [ "$DEVICE" = cpu ] && bench_args+=(--tiny)
  # shellcheck disable=SC2206  # BENCH_ARGS is split on purpose
  PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 timeout 420 \
    "$PY" benchmarks/gpu_bench.py "${bench_args[@]}" ${BENCH_ARGS:-} --out "$OUT/gpu_bench.json" \
    > "$OUT/gpu_bench.log" 2>&1 || failed+=("gpu_bench (log: $OUT/gpu_bench.log)")
  tail -n 3 "$OUT/gpu_bench.log"
fi

echo "--- figures in $OUT"
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu smoke: FAILED: ${failed[*]}; vLLM part $vllm_note"
  exit 1
fi
echo "gpu smoke: ok (host part on $DEVICE); vLLM part $vllm_note"
exit 0
