# The two commands of the README: `make run` and `make test`. Each installs what it needs first.
VENV ?= .venv
CONFIG ?= configs/quickstart.yaml
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install run test lint bench

install:
	@scripts/ensure-java
	@VENV=$(VENV) scripts/ensure-venv

run: install
	$(VENV)/bin/streamgauge run --config $(CONFIG) $(ARGS)

test: install
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
