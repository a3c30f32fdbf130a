# kvcost — every target creates .venv and installs the project first when needed.
# The venv holds exactly the versions pinned (with hashes) in requirements.lock, the set the
# tests pass with; pyproject.toml keeps the ranges for library users. The lock or pyproject.toml
# changing rebuilds .venv from scratch. The installer is uv (pinned below), itself installed
# into the venv by the pip that python3.11 ships, so a fresh machine needs only python3.11.
# --compile-bytecode: pip writes .pyc files at install and uv does not by default; where
# PYTHONDONTWRITEBYTECODE is set (as on the team's machines) every test run would otherwise
# recompile MLflow, pandas, scikit-learn … in each process (+40 s of CPU for `make test`).
PYTHON ?= python3.11
UV_VERSION := 0.13.8
LOCK := requirements.lock
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UV := $(BIN)/uv

.PHONY: demo test bench lint lock clean

# A bare venv holding only the pinned uv.
define new_venv
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; set PYTHON=/path/to/python3.11"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv==$(UV_VERSION)
endef

$(STAMP): pyproject.toml $(LOCK)
	rm -rf $(VENV)
	$(new_venv)
	$(UV) pip install --quiet --python $(BIN)/python --no-deps --require-hashes --compile-bytecode -r $(LOCK)
	$(UV) pip install --quiet --python $(BIN)/python --no-deps -e .
	$(UV) pip check --quiet --python $(BIN)/python
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/kvcost experiment --trace mooncake-conversation --workers 4

test: $(STAMP)
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/pytest -q -m bench -s -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .

# Re-pin after changing a dependency range in pyproject.toml: keeps every pin that still fits
# (add UPGRADE='--upgrade-package NAME' to move one), then run the tests before committing it.
lock:
	$(if $(wildcard $(UV)),,$(new_venv))
	$(UV) pip compile pyproject.toml --extra dev --universal --generate-hashes $(UPGRADE) \
		--custom-compile-command "make lock" --quiet -o $(LOCK)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
