# The two commands of the README: `make demo` and `make test`.
# Each builds .venv, installs the project and fetches the jars on first use.

VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test setup lint bench clean

$(STAMP): pyproject.toml
	@py=$$(scripts/check-prereqs.sh) || exit 1; \
	  if [ ! -x $(BIN)/python ]; then echo "creating $(VENV) with $$py"; $$py -m venv $(VENV); fi
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

setup: $(STAMP)
	$(BIN)/txbridge setup

demo: setup
	$(BIN)/txbridge demo $(ARGS)

test: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: setup
	$(BIN)/txbridge bench $(ARGS)

clean:
	-$(BIN)/txbridge kafka stop
	rm -rf $(VENV) .cache
