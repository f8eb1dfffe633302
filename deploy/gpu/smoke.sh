#!/usr/bin/env bash
# GPU smoke on a CUDA host: the vllm engine on the tiny model (and UI-TARS with --uitars DIR or
# $DART_UITARS_DIR), answers checked against the CPU engine, weight swaps timed. Its own
# virtualenv (.venv-gpu): the gpu extra brings vLLM and the CUDA torch it needs, which the CPU
# .venv (torch==2.13.0, CPU wheel) must never get. See benchmarks/gpu_smoke.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -x .venv-gpu/bin/python ]; then
  python3 -m venv .venv-gpu
  .venv-gpu/bin/pip install -q -e '.[gpu]'
fi
mkdir -p benchmarks/results
exec .venv-gpu/bin/python benchmarks/gpu_smoke.py --out benchmarks/results/gpu_smoke.json "$@"
