# Two commands do all set-up on a fresh Debian machine as root: `make run` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DART := $(VENV)/bin/dart
APT_PACKAGES := xvfb xdotool x11-utils openbox mousepad libreoffice-calc imagemagick \
                libreoffice-writer libreoffice-impress chromium vlc gimp thunderbird xterm pcmanfm \
                libvirt-dev libvirt-clients libvirt-daemon pkg-config docker-compose \
                qemu-system-x86 qemu-utils busybox-static linux-image-cloud-amd64
STAMP := $(VENV)/.installed

# Property-based suites over everything that parses outside input; `make test` runs them bounded
# (hypothesis profile "default"), `make fuzz` long (profile "fuzz", FUZZ_EXAMPLES examples each).
FUZZ_TESTS := tests/events/test_codec_fuzz.py tests/agent/test_uitars_properties.py \
              tests/vm/test_protocol_fuzz.py tests/data/test_sqlguard.py tests/data/test_sqlguard_fuzz.py
FUZZ_EXAMPLES ?= 20000

.PHONY: run test fuzz install system-deps bench ablate lint clean compose-test contract-test gpu-lock

run: install
	$(DART) doctor || true
	$(DART) up configs/synthetic.yaml

# Two test processes, each taking whole files (a file's fixtures, e.g. its desktop, stay in one
# process): most of the suite waits on brokers, apps and subprocesses, so two halve the wall time
# on 2 cores (17:46 -> 9:32 measured). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

fuzz: install
	HYPOTHESIS_PROFILE=fuzz FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider \
	  --timeout 0 $(FUZZ_TESTS) $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/run_all.py

# Learning runs are benchmarks, not tests: each is a whole `dart up` (~20-30 min on 2 cores).
ablate: install
	$(PY) benchmarks/learning.py --ablate --config configs/chain.yaml --seeds 0 1 2

# deploy/compose/embedded.yml end to end in Docker (root; installs docker.io, debootstrap and
# docker-compose if missing; its own dockerd; images cached in /var/lib/dart-compose-test).
compose-test:
	bash deploy/compose-test/compose-test.sh

# vLLM contract: every vLLM name, signature and argument dart uses, checked against the pinned
# vLLM itself on CPU (tests/vllm_contract/), in a venv of its own as the GPU worker would have.
# Light on purpose: the CPU torch first (as above), vLLM --no-deps, then only what its modules
# import (deploy/gpu/contract-requirements.txt) at the GPU lock's versions; no CUDA wheel.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIN = $(shell sed -n 's/^vllm==//p' deploy/gpu/constraints.txt)
contract-test: $(VLLM_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m pytest -q -c /dev/null --rootdir . \
	  --confcutdir tests/vllm_contract -p no:cacheprovider -o addopts='' -W ignore::DeprecationWarning --tb=short --timeout 300 tests/vllm_contract $(PYTEST_ARGS)

$(VLLM_STAMP): pyproject.toml deploy/gpu/constraints.txt deploy/gpu/contract-requirements.txt
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q --no-deps -c deploy/gpu/constraints.txt vllm==$(VLLM_PIN) xgrammar
	$(VLLM_VENV)/bin/pip install -q -c deploy/gpu/constraints.txt -r deploy/gpu/contract-requirements.txt
	$(VLLM_VENV)/bin/python -c "import torch, sys; sys.exit(0 if not torch.version.cuda else 'a CUDA torch was installed')"
	touch $(VLLM_STAMP)

# deploy/gpu/constraints.txt from the gpu extra's pins (pip's resolver on PyPI, metadata only).
gpu-lock:
	python3 deploy/gpu/lock.py

lint: install
	$(VENV)/bin/ruff check .

install: $(STAMP)

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

$(STAMP): pyproject.toml Makefile
	$(MAKE) system-deps
	test -x $(PY) || python3 -m venv $(VENV)
	# The CPU wheel first, so nothing below can resolve torch to a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,vm]'
	$(PY) -c "import torch, sys; sys.exit(0 if not torch.version.cuda else 'a CUDA torch was installed')"
	touch $(STAMP)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache
