# Two commands set up and run everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo lint test bench bench-peers bench-metrics bench-ray clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade "pip>=23.1"

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e ".[test,quantus,docs]"
	touch $(VENV)/.installed $(VENV)/.installed-docs $@

$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e ".[docs]"
	touch $(VENV)/.installed $@

demo: $(VENV)/.installed
	$(BIN)/explain run data/images --out out --method gradcam,gradcam++,layercam
	@echo "Open the explorer in a browser: file://$(abspath out/index.html)"

# The linter, the formatter's check and the type checker on the package (configured in
# pyproject.toml; the lint extra comes with the test extra).
lint: $(VENV)/.installed-test
	$(BIN)/ruff check explain
	$(BIN)/ruff format --check explain
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q --durations=20

# The documentation site, to docs/_build/html; any warning (a broken docstring, a dead
# cross-reference) fails it. tests/test_docs.py runs the same build in `make test`.
.PHONY: docs
docs: $(VENV)/.installed-docs
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html
	@echo "Open the site in a browser: file://$(abspath docs/_build/html/index.html)"

# bench_heavy.py alone takes about 3 hours on 2 CPU cores (its docstring says how to narrow it);
# the zoo sweep (every timm family, every Hugging Face image classifier) about 2 hours, resumable.
bench: $(VENV)/.installed
	$(BIN)/python benchmarks/bench_gradcam.py
	$(BIN)/python benchmarks/bench_transformers.py
	$(BIN)/python benchmarks/bench_zoo_sweep.py --max-size 96 --results out/zoo-sweep.jsonl
	$(BIN)/python benchmarks/bench_zoo_sweep.py --report --results out/zoo-sweep.jsonl
	$(BIN)/python benchmarks/bench_detectors.py
	$(BIN)/python benchmarks/bench_volumes.py
	$(BIN)/python benchmarks/bench_cli.py
	$(BIN)/python benchmarks/bench_attribution.py
	$(BIN)/python benchmarks/bench_anchors.py
	$(BIN)/python benchmarks/bench_faithfulness.py
	$(BIN)/python benchmarks/bench_metrics.py
	$(BIN)/python benchmarks/bench_viewer.py
	$(BIN)/python benchmarks/bench_interrupt.py
	$(BIN)/python benchmarks/bench_concepts.py
	$(BIN)/python benchmarks/bench_heavy.py

# The peers (pytorch-grad-cam, torchcam) are an optional extra, installed for this alone.
bench-peers: $(VENV)/.installed
	$(BIN)/python -m pip install -e ".[peers]"
	$(BIN)/python benchmarks/bench_peers.py

# The metrics against the bare model passes and Quantus (the `quantus` extra, installed for
# this alone); about 15-20 minutes on 2 cores.
bench-metrics: $(VENV)/.installed
	$(BIN)/python -m pip install -e ".[quantus]"
	$(BIN)/python benchmarks/bench_metrics.py

# The Ray engine against the local engine, and its driver's memory (the `ray` extra).
bench-ray: $(VENV)/.installed
	$(BIN)/python -m pip install -e ".[ray]"
	$(BIN)/python benchmarks/bench_ray.py

clean:
	rm -rf $(VENV) out .pytest_cache docs/_build
