# gpuready: `make demo` runs the pipeline on the lab, `make test` runs lint + unit + lab tests.
# Both do all their set-up themselves on a fresh Debian/Ubuntu machine as root.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Debian packages the lab needs on this machine (the lab hosts install their own).
# debian-archive-keyring: debootstrap verifies bookworm and trixie against it. Open MPI and
# mpi4py run the multi-node all_reduce_perf simulator in its unit tests. gcc and libc6-dev: the
# kubelet is linked with cgo, as upstream links it (lab/kube/build.py); runc with cgo and
# libseccomp (pkg-config finds it), as its release is (lab/runtime/build.py).
LAB_DEBS := debootstrap debian-archive-keyring systemd-container dpkg-dev gnupg openssh-client \
	util-linux iproute2 openmpi-bin python3-mpi4py gcc libc6-dev libseccomp-dev pkg-config
# The report page's browser test (tests/unit/validate/test_report_browser.py) drives Debian's Chromium
# through Playwright; Playwright's own browser download is never used.
BROWSER_DEBS := chromium
STAMP_PY := $(VENV)/.installed-requirements
UV_VERSION := 0.13.9
STAMP_DEBS := .lab/.installed-debs
BESIDE_LOG := .lab/test-beside.log
TIMES_LAB := .lab/test-times-lab
TIMES_UNIT := .lab/test-times-unit.json
PYTEST_ARGS ?=
NODES ?= 8
LAB_INOTIFY_INSTANCES := 1024

.PHONY: help setup lint lint-tree lint-code unit lab-test test demo lab-up lab-down lab-status bench docs clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

setup: $(STAMP_PY) $(STAMP_DEBS) ## .venv, pinned Python deps, the lab's Debian packages, Kubernetes, containerd, runc and Kueue built from source
	@# The pinned Kubernetes release and its etcd, and the previous patch release's kubelet,
	@# kubeadm and kubectl, built from the Go module proxy once per machine into
	@# ~/.cache/gpuready/kube (lab/kube/build.py): 20-25 minutes on 2 cores the first time,
	@# nothing after that until a go.mod or go.sum changes. containerd 2 (two releases) and runc
	@# likewise into ~/.cache/gpuready/runtime (lab/runtime/build.py): 5-10 minutes the first time.
	@# Kueue's manager at the release the cluster layer pins into ~/.cache/gpuready/kueue
	@# (lab/kueue/build.py): about 9 minutes the first time.
	$(PY) -m lab.kube.build
	$(PY) -m lab.runtime.build --quiet
	$(PY) -m lab.kueue.build --quiet
	@# Each booted lab host holds 8 inotify instances (lab/limits.py) and the largest test fleet
	@# has 16: with the common default of 128 those alone would use all of them. Raised for this
	@# boot only (not persisted); where it cannot be raised, `lab up` names the limit and refuses.
	@have=$$(cat /proc/sys/fs/inotify/max_user_instances); want=$(LAB_INOTIFY_INSTANCES); \
	if [ "$$have" -lt "$$want" ] && [ "$$(id -u)" = 0 ]; then \
	  echo "setup: fs.inotify.max_user_instances $$have -> $$want for the lab (sysctl, until reboot)"; \
	  sysctl -qw fs.inotify.max_user_instances=$$want || echo "setup: could not raise it; lab up will say which fleets fit"; \
	fi

$(STAMP_PY): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# uv installs the pinned requirements (docs/dependencies.md): on the 2-core machine 2-7 s
	@# (its cache warm or cold) against 45-57 s for pip with its cache warm. uv itself is pinned
	@# and comes from PyPI through the venv's pip. Then the project itself, editable and without
	@# dependencies (requirements.txt pins them): validate, lab and tools import from anywhere.
	$(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install -q --python $(PY) -r requirements.txt
	$(VENV)/bin/uv pip install -q --python $(PY) --no-deps -e .
	touch $@

$(STAMP_DEBS): Makefile
	@# apt-get runs only for the packages that are not installed yet, so a machine that has them
	@# all (a second clone, a non-root user) needs neither root nor the network here. A real
	@# kubectl for the tests against the lab's API server: the one on PATH if any (it may be
	@# another vendor's package that Debian's would conflict with), else Debian's.
	@missing=$$(for p in $(LAB_DEBS) $(BROWSER_DEBS); do \
	  dpkg-query -W -f='$${db:Status-Abbrev}' "$$p" 2>/dev/null | grep -q '^ii' || echo "$$p"; done); \
	command -v kubectl >/dev/null || missing="$$missing kubernetes-client"; \
	missing=$$(echo $$missing); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "setup: the lab's Debian packages need root: sudo apt-get install $$missing"; exit 2; fi; \
	  echo "setup: apt-get install $$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	mkdir -p .lab && touch $@

lint: lint-tree lint-code ## ruff, mypy --strict (validate/, tools/), yamllint --strict, ansible-lint (production), reuse lint

lint-tree: $(STAMP_PY) ## the linters that find their files in the checkout: yamllint --strict, reuse lint, ansible-lint
	$(VENV)/bin/yamllint --strict .
	@# Every file's licence and copyright, machine-readable (REUSE.toml, LICENSES/); one line per problem.
	$(VENV)/bin/reuse lint --lines
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/ansible-lint -q

lint-code: $(STAMP_PY) ## the linters of the project's Python: ruff, mypy --strict (validate/, tools/, the roles' host probe)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	@# A script the roles run on the hosts, not a package: mypy takes packages or files, not both.
	$(VENV)/bin/mypy --strict roles/host_probe/files/host_probe.py

unit: $(STAMP_PY) ## unit tests (no root, no lab; the report page test needs chromium: make setup)
	@# The gate's and drift's tests run the built etcd and kube-apiserver (lab/kube/local.py):
	@# built here if this machine has not built them yet (make setup does), else at once.
	$(PY) -m lab.kube.build
	$(PY) -m lab.runtime.build --quiet
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

lab-test: setup ## lab tests: boot hosts, converge, validate, inject faults (root)
	$(PY) -m pytest tests/lab -q $(PYTEST_ARGS)

test: setup lint-tree ## everything CI runs: lint, unit and lab tests (lint-code and unit beside the lab tests)
	@# The lab tests take most of the time. ruff, mypy (they read the project's Python only) and
	@# the unit suite (about 1.5 CPU-minutes; much of its time is spent waiting on misbehaving
	@# peers) run beside them, not before. yamllint, reuse and ansible-lint find their files by
	@# walking the checkout, where the lab writes while it runs (a rootfs being built has /proc
	@# mounted under it; the lab inventory comes and goes), so they run first. The output of what
	@# ran beside is held in $(BESIDE_LOG) and shown when the lab tests end; make test fails if
	@# either part failed. The lab tests run as two labs at once (tools/lab_tests.py: a second
	@# session with its own lab, in a copy of the checkout's files). It ends with each lab
	@# module's and the unit suite's wall time (tests/conftest.py writes them, tools/ci_times.py
	@# prints the table).
	@mkdir -p .lab; rm -f $(TIMES_LAB)-first.json $(TIMES_LAB)-second.json $(TIMES_UNIT); \
	( $(MAKE) --no-print-directory lint-code && \
	  GPUREADY_TEST_TIMES=$(TIMES_UNIT) $(PY) -m pytest tests/unit -q $(PYTEST_ARGS) ) \
	  > $(BESIDE_LOG) 2>&1 & beside=$$!; \
	lab_rc=0; $(PY) -m tools.lab_tests --times $(TIMES_LAB) $(PYTEST_ARGS) || lab_rc=$$?; \
	beside_rc=0; wait $$beside || beside_rc=$$?; \
	echo "== lint-code and unit tests (run beside the lab tests; $(BESIDE_LOG)):"; cat $(BESIDE_LOG); \
	echo "== make test: wall time per part"; $(PY) -m tools.ci_times $(TIMES_LAB)-first.json $(TIMES_LAB)-second.json --unit $(TIMES_UNIT) || true; \
	echo "make test: lab tests exit $$lab_rc; lint-code and unit tests exit $$beside_rc"; \
	[ $$lab_rc -eq 0 ] && [ $$beside_rc -eq 0 ]

lab-up: setup ## boot the lab (NODES=8, or FLEET=faults|demo|cluster)
	$(PY) -m lab up $(if $(FLEET),--fleet $(FLEET),--nodes $(NODES))

lab-down: setup ## stop the lab; leaves nothing running or mounted
	$(PY) -m lab down

lab-status: ## show lab hosts, addresses, pools and faults
	$(PY) -m lab status

demo: setup ## the whole pipeline on the lab, ending with a pointer to the report
	$(PY) -m lab.demo

bench: setup ## benchmarks (bench/*.py), ratios against baselines run side by side
	for b in bench/[a-z]*.py; do echo "== $$b"; b=$${b%.py}; $(PY) -m $${b//\//.}; done

docs: $(STAMP_PY) ## regenerate docs/roles.md from the roles' meta/argument_specs.yml
	$(PY) -m tools.role_reference

clean: lab-down ## stop the lab and remove generated reports (keeps the rootfs cache)
	$(PY) -m tools.lab_tests --down
	find reports -mindepth 1 -not -name README.md -exec rm -rf {} +
