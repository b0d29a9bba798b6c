# warmstart.snapshot - developer and CI entry points.
#   make demo   prepare this machine and run the main job on localhost
#   make test   everything CI runs: unit, sanity, lint, integration, molecule
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
SANITY_VENV := .venv-sanity
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_FORCE_COLOR ?= 0
LINK := .collections/ansible_collections/warmstart/snapshot
# Outside this git checkout: inside it, ansible-test would list files with git
# and see none (build/ is ignored).
# one per checkout: two checkouts' sanity runs at once (a CI clone beside a working copy) must not share it
SANITY_BASE := $(or $(TMPDIR),/tmp)/warmstart-sanity-$(shell printf '%s' '$(CURDIR)' | md5sum | cut -c1-8)
SANITY_ROOT := $(SANITY_BASE)/ansible_collections/warmstart/snapshot
VERSION := $(shell awk '/^version:/ {print $$2}' galaxy.yml)

.PHONY: help deps venv link demo check test unit typecheck sanity lint integration molecule build install clean

help:
	@echo "make demo        prepare localhost (CRIU bundle, pycriu, seccomp, snapshot root) and run the demo"
	@echo "make check       typecheck + unit + ansible-lint: the quick loop while editing"
	@echo "make test        unit + sanity + ansible-lint + integration + molecule (needs root)"
	@echo "make unit | typecheck | sanity | lint | integration | molecule   one part of it"
	@echo "make build       build the collection tarball; make install installs it for this user"

deps:
	@bash tests/support/install-system-deps.sh

$(BIN)/.stamp: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

venv: $(BIN)/.stamp

link:
	@mkdir -p $(dir $(LINK)) && ln -sfn ../../.. $(LINK)

demo: deps venv link
	ansible-playbook warmstart.snapshot.demo

test: deps venv link typecheck unit sanity lint integration molecule
	@echo "make test: all suites passed"

check: typecheck unit lint
	@echo "make check: typecheck, unit and lint passed"

# On every core (pytest-xdist); pytest.ini prints the 20 slowest tests at the end.
unit: venv link
	$(BIN)/python -m pytest -q -n auto tests/unit

# mypy --strict over the engine (see mypy.ini), resolved through the collection link.
typecheck: venv link
	cd .collections && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/mypy.ini -p ansible_collections.warmstart.snapshot.plugins.module_utils

# ansible-test needs the collection under ansible_collections/<ns>/<name>:
# copy the tracked (and new, not ignored) files there and run it in its own venvs.
sanity: venv $(SANITY_VENV)/.stamp
	@pipver=$$(sed -n "s/^ *pip='\([0-9.]*\)',/\1/p" $(SANITY_VENV)/lib/python3*/site-packages/ansible_test/_internal/python_requirements.py | head -n1); \
	  cache=$$HOME/.ansible/test/cache/get_pip_$${pipver//./_}.py; \
	  mkdir -p $$(dirname $$cache); cmp -s tests/support/get_pip_offline.py $$cache || cp tests/support/get_pip_offline.py $$cache
	rm -rf $(SANITY_BASE) && mkdir -p $(SANITY_ROOT)
	git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t $(SANITY_ROOT)
	cd $(SANITY_ROOT) && $(CURDIR)/$(SANITY_VENV)/bin/ansible-test sanity --local --python 3.11 --color no

# ansible-test from the same ansible-core, in a venv of its own (it installs
# its pinned linters into per-test venvs; the main venv stays untouched).
$(SANITY_VENV)/.stamp: requirements.txt
	$(PYTHON) -m venv $(SANITY_VENV)
	$(SANITY_VENV)/bin/pip install --disable-pip-version-check -q "$$(grep '^ansible-core==' requirements.txt)"
	touch $@

lint: venv link
	ansible-lint --profile production --strict

# Two at a time (a module stays on one worker, so its module fixtures hold), then the modules marked
# `serial` alone: they check the node's whole mount table or watch for any CRIU worker.
integration: venv link
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not serial" tests/integration
	$(BIN)/python -m pytest -q -m serial tests/integration

molecule: venv link
	bash tests/support/run-molecule.sh node_prep
	bash tests/support/run-molecule.sh fleet

build: venv
	ansible-galaxy collection build --force --output-path build/

# Into this user's collections (ansible.cfg's first path is the checkout's own link dir).
install: build
	ansible-galaxy collection install --force -p ~/.ansible/collections build/warmstart-snapshot-$(VERSION).tar.gz

clean:
	rm -rf build .collections tests/output
