# One image for every dart service (broker, env worker, rollout worker, data manager, trainer,
# archiver, one-shot initialisers). docker-compose.yml builds it twice: the default CPU image,
# and with EXTRAS=gpu TORCH_INDEX_URL=<a CUDA index> for the vLLM rollout worker of the `gpu`
# profile.
#
#   docker build -t dart:local .
#   docker build -t dart:local --build-arg XDESKTOP=1 .        # + the X desktop env backend
#   docker build -t dart:gpu --build-arg EXTRAS=gpu \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#   docker build -t dart:local --build-arg BASE=dart-base:bookworm .   # a locally made base
#
# BASE: any Debian-like image with python3 >= 3.11 and its venv module (`make compose-test`
# makes one with debootstrap; deploy/compose-test/base-image.sh). Layers, slowest first: system
# packages, torch, the dependencies (from pyproject.toml only), then the code: a code-only
# change rebuilds the last layer (seconds).
#
# Where pip finds packages: pip's own settings. A build that must use other sources (local
# indexes, a wheel directory served on loopback, a CA bundle; build with --network host) passes
# them as the build args PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_TRUSTED_HOST,
# PIP_CERT (build-time only: they are not in the image's environment).
ARG BASE=python:3.11-slim-bookworm

# The requirement list of pyproject.toml (+ EXTRAS), alone in a file: the dependency layer below
# is rebuilt when that list changes, not on every edit of pyproject.toml.
FROM ${BASE} AS requirements
ARG EXTRAS=""
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c "import sys, tomllib; \
p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
extras = [e for e in sys.argv[1].split(',') if e]; \
print('\n'.join(p['dependencies'] + [d for e in extras for d in p['optional-dependencies'][e]]))" \
    "$EXTRAS" > /tmp/requirements.txt

FROM ${BASE}

# 1 installs what the xdesktop env backend drives (Xvfb, xdotool, a window manager and real
# apps); 0 keeps the image small for the synthetic and libvirt backends.
ARG XDESKTOP=0
# pip extras of dart-rl to install besides the core: "" (CPU), "gpu" (vLLM), "vm" (libvirt).
ARG EXTRAS=""
# Where torch comes from. The default is the CPU wheel index; empty: pip's own sources (which
# must then offer the CPU build, as a find-links directory holding torch-*+cpu does).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_TRUSTED_HOST
ARG PIP_CERT

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8

RUN set -eux; \
    pkgs=""; \
    if [ "$XDESKTOP" = "1" ]; then pkgs="$pkgs xvfb xdotool x11-utils openbox mousepad libreoffice-calc"; fi; \
    case ",$EXTRAS," in *,vm,*) pkgs="$pkgs libvirt-dev pkg-config gcc libc6-dev python3-dev";; esac; \
    if [ -n "$pkgs" ]; then \
      apt-get update; \
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs; \
      rm -rf /var/lib/apt/lists/*; \
    fi

# The unprivileged user, and every mount point of the named volumes (docker-compose.yml and
# deploy/compose/embedded.yml) owned by it: a fresh named volume takes the owner of the
# directory it is mounted on, and is root's where the image has none. /run/dart-secrets-for/*:
# where secrets-init (root) writes each consumer's volume before handing it to that uid.
RUN set -eux; \
    useradd --create-home --uid 1000 --shell /bin/bash dart; \
    mkdir -p /data/blobs /data/models /data/checkpoints /data/log /data/chdb /run/dart-secrets /etc/dart; \
    chown dart:dart /data /data/blobs /data/models /data/checkpoints /data/log /data/chdb /run/dart-secrets; \
    chmod 0700 /run/dart-secrets; \
    mkdir -p -m 0700 /run/dart-secrets-for/clickhouse /run/dart-secrets-for/data-manager

# A virtualenv (Debian's python3 refuses system-wide installs, PEP 668); torch first, from the
# index above, so that nothing below can resolve torch to another build. NOTE: the CPU image must
# never hold CUDA (gigabytes of libraries nothing on a CPU host can use): the check after the
# dependencies fails the build if a CUDA torch or an nvidia-*/triton package slipped in. Only the
# gpu image (EXTRAS=gpu) may carry CUDA.
RUN set -eux; \
    python3 -m venv /opt/venv; \
    pip install "torch==${TORCH_VERSION}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}

COPY --from=requirements /tmp/requirements.txt /opt/dart-requirements.txt
RUN set -eux; \
    pip install -r /opt/dart-requirements.txt "setuptools>=68"; \
    case ",$EXTRAS," in \
      *,gpu,*) ;; \
      *) python -c "import sys, torch, importlib.metadata as md; \
cuda = sorted(d.metadata['Name'] for d in md.distributions() \
              if d.metadata['Name'].lower().startswith(('nvidia-', 'triton')) and d.metadata['Name'].lower() != 'nvidia-ml-py'); \
sys.exit(f'CUDA in a CPU image: torch {torch.__version__} (cuda {torch.version.cuda}), {cuda}' if torch.version.cuda or cuda else 0)";; \
    esac

# The code: dart as a wheel (its schemas and configs are package data), and deploy/ for the
# compose helpers (secrets_init.py, register_tasks.py, healthcheck.py).
WORKDIR /opt/dart
COPY pyproject.toml setup.py MANIFEST.in README.md LICENSE ./
COPY schemas ./schemas
COPY configs ./configs
COPY dart ./dart
COPY deploy ./deploy
RUN set -eux; \
    pip install --no-deps --no-build-isolation .; \
    rm -rf build dart_rl.egg-info; \
    cd /; dart --help > /dev/null; \
    python -c "from dart.events.codec import SCHEMA_DIR; assert '/opt/venv/' in str(SCHEMA_DIR), SCHEMA_DIR"

USER dart
WORKDIR /home/dart
ENV DART_BOOTSTRAP=kafka:9092
CMD ["dart", "--help"]
