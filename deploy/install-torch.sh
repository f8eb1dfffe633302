#!/usr/bin/env bash
# Install torch's CPU build into a virtualenv, the way a CPU user gets it anywhere. `make install`
# runs it before `pip install -e .`, so nothing after it can resolve torch to a CUDA build.
#
#   deploy/install-torch.sh VENV [VERSION] [PIP ARGS...]     e.g. deploy/install-torch.sh .venv 2.13.0
#
# In this order:
#   1. pip's own configuration already offers a CPU build (a find-links directory or a mirror
#      holding torch-VERSION+cpu, or a platform whose PyPI wheel has no CUDA, e.g. macOS):
#      install that; nothing is downloaded from elsewhere.
#   2. else PyTorch's CPU wheel index ($DART_TORCH_INDEX, default https://download.pytorch.org/whl/cpu),
#      with PyPI ($DART_PYPI_INDEX, default https://pypi.org/simple) for torch's own dependencies.
#   3. else (that index cannot be reached) whatever PyPI gives, which on Linux x86-64 is the CUDA
#      build (with its nvidia-* packages; it runs on a CPU too). The install goes on, and the
#      last lines say what was installed and the one command that swaps in the CPU build.
# PIP ARGS go to every pip call that installs (a test passes --dry-run --report FILE).
set -euo pipefail

VENV=${1:?usage: deploy/install-torch.sh VENV [VERSION] [PIP ARGS...]}
VERSION=${2:-2.13.0}
shift $(( $# >= 2 ? 2 : 1 ))
PY="$VENV/bin/python"
CPU_INDEX=${DART_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PYPI_INDEX=${DART_PYPI_INDEX:-https://pypi.org/simple}
# A blocked index must cost seconds, not pip's default timeout (minutes, with retries).
PROBE_TIMEOUT_S=${DART_TORCH_PROBE_TIMEOUT_S:-5}

say() { echo "[install-torch] $*"; }

# The build pip would install for torch==VERSION with the given sources: "cpu", "cuda" or "none"
# (nothing resolves). A CPU build is one whose version carries the +cpu label or that requires no
# CUDA package (PyPI's macOS and aarch64 wheels).
resolve() {
  local report
  report=$(mktemp)
  if ! "$PY" -m pip install -q --dry-run --ignore-installed --no-deps --timeout "$PROBE_TIMEOUT_S" --retries 0 \
        --report "$report" "$@" "torch==$VERSION" >/dev/null 2>&1; then
    rm -f "$report"; echo none; return
  fi
  "$PY" - "$report" <<'EOF'
import json, re, sys
items = json.load(open(sys.argv[1]))["install"]
meta = items[0]["metadata"] if items else {}
needs_cuda = any(re.match(r"(nvidia-|cuda-|triton)", r.lower()) and "extra ==" not in r
                 for r in meta.get("requires_dist", []))
print("none" if not items else "cpu" if meta.get("version", "").endswith("+cpu") or not needs_cuda else "cuda")
EOF
  rm -f "$report"
}

reachable() {  # the index answers for torch within the probe timeout (https or file://)
  "$PY" - "$1/torch/" "$PROBE_TIMEOUT_S" <<'EOF' >/dev/null 2>&1
import os, sys, urllib.parse, urllib.request
url = sys.argv[1]
if url.startswith("file:"):  # a local PEP 503 index: the project's directory (pip reads its index.html)
    sys.exit(0 if os.path.isdir(urllib.parse.urlparse(url).path) else 1)
with urllib.request.urlopen(url, timeout=float(sys.argv[2])) as r:
    r.read(1)
EOF
}

if [ "$(resolve)" = cpu ]; then
  say "torch $VERSION: the CPU build pip's configuration offers"
  "$PY" -m pip install -q "$@" "torch==$VERSION"
  exit 0
fi

if reachable "$CPU_INDEX"; then
  say "torch $VERSION: the CPU build from $CPU_INDEX (one 192 MB wheel for CPython 3.11 on x86-64; dependencies from $PYPI_INDEX)"
  "$PY" -m pip install -q --index-url "$CPU_INDEX" --extra-index-url "$PYPI_INDEX" "$@" "torch==$VERSION"
  exit 0
fi

say "WARNING: $CPU_INDEX cannot be reached (within ${PROBE_TIMEOUT_S} s); installing torch $VERSION from pip's"
say "         own sources instead. On Linux x86-64 that is the CUDA build, with 28 more packages (nvidia-*,"
say "         triton, cuda-*). It runs on a CPU too; dart works with it."
"$PY" -m pip install -q "$@" "torch==$VERSION"
say "installed: $("$PY" -c 'import torch; print(torch.__version__, "CUDA " + torch.version.cuda if torch.version.cuda else "CPU")' 2>/dev/null || echo "torch $VERSION (not importable yet)")"
say "for the CPU build once $CPU_INDEX can be reached:"
say "  $PY -m pip install --force-reinstall --no-deps --index-url $CPU_INDEX torch==$VERSION"
