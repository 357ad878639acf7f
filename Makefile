# trainopt — build the site and run the whole suite from a clean clone.
#   make html       create .venv, install trainopt[docs], build the site into _build/html (-W)
#   make test       same set-up, then `make lint`, then unit tests + Sybil over docs/ and src/ +
#                   audits + -W build, on two pytest-xdist workers (PYTEST_WORKERS=2;
#                   PYTEST_ARGS=-n0 runs serially)
#   make lint       ruff: the formatter's check and the linter (100 columns), over every .py file
#   make test-gpu   make test with TRAINOPT_REQUIRE_CUDA=1 (GPU-only examples must run, not skip)
#   make livehtml   rebuild on change and serve on http://127.0.0.1:8000
#   make linkcheck  check internal links of the built site (no network)
#   make clean      remove the build and the virtual environment

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Where no torch is installed yet, this is what gets installed first. On the project's machines
# torch==2.13.0 resolves to a CPU build on local disk; elsewhere override it, e.g.
#   make test TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
SPHINXOPTS ?= -W --keep-going
# pytest-xdist workers: two (CI's machine has two cores), one where there is a single core. Each
# file runs on one worker (see conftest.py), and the site is built once per run.
# `make test PYTEST_ARGS=-n0` runs serially; PYTEST_WORKERS=auto uses every core.
PYTEST_WORKERS ?= $(shell n=$$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 2); echo $$(( n < 2 ? n : 2 )))
PYTEST_ARGS ?=
# --no-compile: pip does not byte-compile every module of torch, transformers and the rest at
# install (most of an install's time); Python compiles the ones that are imported, once.
PIP_INSTALL := $(VENV)/bin/python -m pip install -q --no-compile

.PHONY: html test test-gpu lint livehtml linkcheck clean venv

LINTED := src docs tests conf.py conftest.py

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# The site's workshop (docs/_lib: trainopt_site, not in the wheel) on the environment's path, so
# that `python -m trainopt_site.stability.corpus` and the like run here.
$(VENV)/.workshop: | $(PY)
	$(PY) -c "import sysconfig, pathlib; pathlib.Path(sysconfig.get_path('purelib'), 'trainopt_site.pth').write_text(str(pathlib.Path('docs/_lib').resolve()) + '\n')"
	touch $@

$(VENV)/.torch: | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP_INSTALL) $(TORCH_SPEC)
	touch $@

$(VENV)/.docs: pyproject.toml $(VENV)/.torch $(VENV)/.workshop
	$(PIP_INSTALL) -e ".[docs]"
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.torch $(VENV)/.workshop
	$(PIP_INSTALL) -e ".[docs,test,hpo]"
	touch $@

venv: $(VENV)/.test

html: $(VENV)/.docs
	$(PY) -m sphinx -b html $(SPHINXOPTS) -c . docs _build/html
	@echo "Open _build/html/index.html"

# One concern per module, enforced by review and by these two: no file is split to meet a count.
lint: $(VENV)/.test
	$(PY) -m ruff format --check --quiet $(LINTED)
	$(PY) -m ruff check --quiet $(LINTED)

# Tiny CPU models run faster on one thread per process (and the distributed tests start several).
test: $(VENV)/.test lint
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-gpu:
	TRAINOPT_REQUIRE_CUDA=1 $(MAKE) test

livehtml: $(VENV)/.docs
	$(PIP_INSTALL) -e ".[docs,dev]"
	$(PY) -m sphinx_autobuild -c . docs _build/html --watch src

linkcheck: $(VENV)/.test
	$(PY) -m sphinx -b html $(SPHINXOPTS) -c . docs _build/html
	$(PY) docs/_ext/internal_links.py _build/html

clean:
	rm -rf _build $(VENV) test-artifacts
