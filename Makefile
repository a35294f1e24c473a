# The README's two commands are `make demo` and `make test`. Every target first
# runs scripts/setup.sh, which sets up a fresh machine (Gloo, .venv, the C++
# build) and returns in seconds when nothing has changed.
VENV := .venv
PY := $(VENV)/bin/python
NP ?= 2
# A safety net for a hung multi-rank test (pytest-timeout), not a budget.
PYTEST_TIMEOUT ?= 900

# The venv first on PATH, so recipes read like the commands in the README
# (`hvdrun -np 2 python ...`) and ranks start the venv's python.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup demo test bench synthetic clean distclean

setup:
	bash scripts/setup.sh

demo: setup
	hvdrun -np $(NP) python examples/digits_allreduce.py

test: setup
	$(PY) -m pytest -q --timeout=$(PYTEST_TIMEOUT) tests

bench: setup
	python bench/allreduce_bench.py -np $(NP)

synthetic: setup
	hvdrun -np $(NP) python examples/synthetic_benchmark.py

# Build outputs only: the venv (a torch download) survives; see distclean.
clean:
	rm -rf build hvd_torch/_C*.so *.egg-info bench/results .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
