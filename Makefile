# Two commands: `make demo` runs the main job on the built-in default,
# `make test` runs the whole test suite. Both set up .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# huge pages for XLA's CPU buffers in the tests and the demo, as the commands
# give themselves (elmo_jax/cli/huge_pages.py)
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

.PHONY: test check demo results docs venv clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-docs.txt requirements-accelerators.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-docs.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --upgrade \
		--target $(VENV)/accelerators -r requirements-accelerators.txt
	touch $(STAMP)

# two pytest workers (pytest-xdist): most tests compile or start processes on
# one core, and the machines here have two. Each worker starts on half of the
# tests, in file order, and takes tests from the other's tail when it runs out
# (worksteal: a long file no longer leaves one core idle at the end)
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=30 tests

# the quick tier for the edit-test loop (under 2.5 minutes on 2 cores): the unit
# tests, without the end-to-end runs and the unit tests marked slow (10+ s each)
check: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not e2e and not slow" tests

demo: $(STAMP)
	$(PY) demo.py

# the site under docs/ (Sphinx, MyST pages, the API from the docstrings), built
# offline into docs/_build/html; a warning is an error
docs: $(STAMP)
	$(PY) -m sphinx -E -W --keep-going -q -b html docs docs/_build/html

results: $(STAMP)
	$(PY) results.py

clean:
	rm -rf $(VENV) .pytest_cache
