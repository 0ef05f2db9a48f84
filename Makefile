# Two entry points that work on a fresh machine: `make export` and `make test`.
# Both create .venv on first use (torch==2.13.0 first, then the project and its tools).
PYTHON ?= python3
# Python may write the .pyc files it compiles (an environment's PYTHONDONTWRITEBYTECODE=1 is lifted for these targets):
# the suite starts hundreds of Python processes, and without them each one compiles every module it imports again.
export PYTHONDONTWRITEBYTECODE :=
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.aitune-installed

.PHONY: venv export test test-fast test-long docs clean benchmarks-page

venv: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh scripts/install_system_deps.sh
	./scripts/bootstrap.sh $(VENV) $(PYTHON)
	touch $@

# The main job on the bundled example: tune it and publish ./model_repository/cnn.
export: venv
	$(BIN)/aitune-export export --overwrite $(ARGS)

# The test suite (real exporters, a real tritonserver and perf_analyzer included), less the `long` tests.
# Two parts: every test not marked `serial` in JOBS pytest-xdist workers (a test file stays in one worker, so its
# module fixtures are built once), then the `serial` ones alone (they need the machine quiet).
JOBS ?= 2
test: venv
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile -m "not long and not serial" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m "serial and not long" $(PYTEST_ARGS)

# The long tests (marked `long`: Ray fleets, Model Analyzer, the s3 -> serve -> validate chain, a server dying mid-search), which `make test` and CI leave out.
test-long: venv
	$(BIN)/python -m pytest -m long $(PYTEST_ARGS)

# Only the tests that build nothing and start no server.
test-fast: venv
	$(BIN)/python -m pytest -m "not slow and not long" $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) into ./site; --strict fails on a broken link or anchor.
# The docs extra comes with bootstrap; a .venv made before it gets the extra here.
docs: venv
	@$(BIN)/python -c "import mkdocs, material, mkdocstrings_handlers.python, mkdocs_click" 2>/dev/null || $(BIN)/python -m pip install -q -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) model_repository aitune-reports .pytest_cache site

# docs/benchmarks.md from the benchmark records in benchmarks/results/ (each benchmark writes its own record there).
benchmarks-page: venv
	$(BIN)/python scripts/render_benchmarks.py
