# The README's two commands: `make run` (install, then the main job) and `make test`.
# Each creates the virtual environment on first use; PYTHON picks the interpreter for it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

install: $(VENV)/.installed

# The main job. Until the reproduction pipeline lands this shows both wind tunnels.
run: install
	$(BIN)/windtunnel sample bijection --n 2 --seed 0 --format table
	$(BIN)/windtunnel sample hmm --n 1 --seed 0 --format table

test: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python bench/tunnels.py
	$(BIN)/python bench/models.py
	$(BIN)/python bench/eval.py

clean:
	rm -rf $(VENV)
