# heads-lab: the two set-up commands are `make demo` and `make test`; both install first.
# Torch is installed before the rest, as the CPU build unless told otherwise:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cu128   (a CUDA build)
#   make install TORCH_SPEC='torch==2.5.1'                            (another version)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.heads-lab-installed
ARGS ?=

.PHONY: install demo test test-slow lint bench clean clean-outputs

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install_torch.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python scripts/install_torch.py
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $@
	@echo "installed heads-lab into $(VENV) (activate with: source $(BIN)/activate)"

demo: install  ## train on the embedded synthetic language pair and print PPL / BLEU
	$(BIN)/heads-lab train $(ARGS)

test: install  ## unit + integration tests, without the slow ones
	$(BIN)/python -m pytest -q -m "not slow" tests $(ARGS)

test-slow: install
	$(BIN)/python -m pytest -q -m slow tests $(ARGS)

bench: install  ## the speed table and its targets (a few minutes; writes bench.json)
	$(BIN)/heads-lab bench $(ARGS)

lint: install
	$(BIN)/ruff check heads_lab tests scripts

clean:  ## the virtual environment (runs in outputs/ are kept)
	rm -rf $(VENV)

clean-outputs:  ## every run and sweep under outputs/
	rm -rf outputs/runs outputs/multiruns
