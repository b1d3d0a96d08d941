# The README's two commands: `make run` (install, then the main job) and `make test`.
# Each creates the virtual environment on first use; PYTHON picks the interpreter for it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run tiny architectures future-work model-selection phases test bench mutate install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The main job needs the package alone; the test extras (scipy, hmmlearn, Ray, W&B,
# TransformerLens, ...) come with `make test`.
$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

# The main job (1-2 hours on 2 cores, by processor; docs/reproducing.md): the CPU-scale reproduction of the paper into reproduction/, report in
# reproduction/report/index.html. Run it again after an interruption: it resumes.
run: install
	$(BIN)/windtunnel reproduce --scale cpu --out reproduction --resume

# A two-minute first look at the whole pipeline (numbers mean nothing at this scale).
tiny: install
	$(BIN)/windtunnel reproduce --scale tiny --out reproduction-tiny --resume

# The architecture-by-primitive table (docs/reproducing.md, the architectures study): transformer, Mamba, LSTM and MLP
# on the bijection, the HMM and associative recall at two sizes, into reproduction-architectures/.
architectures: install
	$(BIN)/windtunnel reproduce --scale cpu --only architectures --out reproduction-architectures --resume

# The same four architectures on the tunnels of the paper's future work (docs/reproducing.md, the future-work
# study): Laplace accumulation (dirichlet, markov) and Gaussian filtering (kalman), into reproduction-future-work/.
future-work: install
	$(BIN)/windtunnel reproduce --scale cpu --only future_work --out reproduction-future-work --resume

# The findings of the authors' model-selection paper (docs/reproducing.md, the model-selection study): one class
# of functions on Z_n in three symbol modes, involutions against 3-cycles, into reproduction-model-selection/.
model-selection: install
	$(BIN)/windtunnel reproduce --scale cpu --only model_selection --out reproduction-model-selection --resume

# The training phases (docs/reproducing.md, the phases study): when the plateau is left and the frame
# forms, over depth, width, the hypothesis space's size and training knobs, into reproduction-phases/.
phases: install
	$(BIN)/windtunnel reproduce --scale cpu --only phases --out reproduction-phases --resume

# Test files run side by side, one per core (pytest-xdist): about 8 minutes on 2 cores.
test: install-test
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# Mutation testing (mutmut) of the packages docs/testing.md scores, then the score per package
# (tools/mutation_score.py). Hours for everything on 2 cores; ONLY narrows it to mutant names,
# e.g. make mutate ONLY='windtunnel.evaluation.* windtunnel.metrics.*'. Not part of `make test`.
# The report's tests read a tiny reproduction built once, first, by the unmutated code (2 minutes).
mutate: install-test
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[mutate]'
	rm -rf .mutate-tiny && $(BIN)/windtunnel reproduce --scale tiny --out $(CURDIR)/.mutate-tiny > /dev/null
	# One thread per mutant: a forked test process whose parent had started OpenMP threads hangs.
	OMP_NUM_THREADS=1 WINDTUNNEL_TINY_REPRODUCTION=$(CURDIR)/.mutate-tiny $(BIN)/mutmut run --max-children $$(nproc) $(ONLY)
	$(BIN)/python tools/mutation_score.py

bench: install
	$(BIN)/python bench/tunnels.py
	$(BIN)/python bench/models.py
	$(BIN)/python bench/eval.py
	$(BIN)/python bench/train_throughput.py

clean:
	rm -rf $(VENV)
