# heads-lab: the two set-up commands are `make demo` and `make test`; both install first.
# `make demo` installs what a user needs to train, sweep and report (heads-lab with the Hydra
# launchers); `make test` adds the test tools and the Ray launcher (the `dev` extra).
# Torch is installed before the rest (torch==2.13.0 from pip's index; without a GPU, a build that
# would pull CUDA packages is refused with the CPU index to use), unless told otherwise:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cu128   (a CUDA build)
#   make install TORCH_SPEC='torch==2.5.1'                            (another version)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.heads-lab-installed
DEV_STAMP := $(VENV)/.heads-lab-dev-installed
ARGS ?=
PYTEST_JOBS ?= 2
TESTS ?= tests

.PHONY: install install-dev demo test test-slow guard lint bench clean clean-outputs

install: $(STAMP)

install-dev: $(DEV_STAMP)

$(STAMP): pyproject.toml scripts/install_torch.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python scripts/install_torch.py
	$(BIN)/python -m pip install --quiet -e ".[launchers]"
	@touch $@
	@echo "installed heads-lab into $(VENV) (activate with: source $(BIN)/activate)"

$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $@

demo: install  ## train on the embedded synthetic language pair and print PPL / BLEU
	$(BIN)/heads-lab train $(ARGS)

test: install-dev  ## unit + integration tests, without the slow ones; the CUDA tests' logic on CPU
	@# PYTEST_JOBS processes (pytest-xdist); a module's tests stay on one (they share its fixtures);
	@# TESTS narrows the run (make test TESTS=tests/unit), ARGS adds pytest options (ARGS=-x)
	$(BIN)/python -m pytest -q -n $(PYTEST_JOBS) --dist loadscope -m "not slow" $(TESTS) $(ARGS)
	@# tests/cuda skip without a GPU; on the CPU (CPU against CPU, ~20 s) they still catch a
	@# test that no longer matches the code (a renamed function went unseen until a GPU ran them)
	HEADS_LAB_CUDA_TESTS_ON=cpu $(BIN)/python -m pytest -q -p no:cacheprovider -m "cuda and not slow" tests/cuda

test-slow: install-dev  ## the long end-to-end tests; those with signals, resumes or timings one at a time
	@# on PYTEST_JOBS processes, then the `serial` ones (stop signals, resumes, two nodes, the
	@# GPU check's timed dry run) alone, where a busy neighbour cannot skew them
	@# (exit 5: TESTS narrowed to files with none of a phase's tests; the other phase runs them)
	$(BIN)/python -m pytest -q -n $(PYTEST_JOBS) --dist loadscope -m "slow and not serial" $(TESTS) $(ARGS) || [ $$? -eq 5 ]
	$(BIN)/python -m pytest -q -m "slow and serial" $(TESTS) $(ARGS) || [ $$? -eq 5 ]
	@# the CUDA tests that compile (captured step) on the CPU, as make test runs the others
	HEADS_LAB_CUDA_TESTS_ON=cpu $(BIN)/python -m pytest -q -p no:cacheprovider -m "cuda and slow" tests/cuda

guard: install-dev  ## the guard numbers against tests/guard_numbers.json (a refactor keeps them; ~3 min)
	$(BIN)/python scripts/guard_numbers.py --out outputs/guard_numbers.json --check tests/guard_numbers.json $(ARGS)

bench: install  ## the speed table and its targets (a few minutes; writes bench.json)
	$(BIN)/heads-lab bench $(ARGS)

lint: install-dev
	$(BIN)/ruff check heads_lab tests scripts

clean:  ## the virtual environment (runs in outputs/ are kept)
	rm -rf $(VENV)

clean-outputs:  ## every run and sweep under outputs/
	rm -rf outputs/runs outputs/multiruns
