# The two commands of the README: `make demo` and `make test`.
# Each builds .venv, installs the project and fetches the jars on first use.
# Longer runs of the fault tests: `make chaos` and `make soak`.

VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test chaos soak setup system-packages lint bench console clean lock matrix

# make chaos: the nemesis (tests/secure/test_nemesis.py) on the secured cluster, one run per seed:
# CHAOS_SEEDS (comma-separated), else CHAOS_RUNS seeds drawn at random; CHAOS_SECONDS of faults
# each (the load lasts until they are over; a run takes about a minute more). Ends with one line
# per run: the seed, the faults of each kind, lost/dup/phantom/order. A failed run is replayed
# with its seed: make chaos CHAOS_SEEDS=<seed> CHAOS_SECONDS=<seconds>.
CHAOS_RUNS    ?= 5
CHAOS_SECONDS ?= 300
CHAOS_SEEDS   ?=
# make soak: every test marked soak (the nemesis, the check soak, and the long runs make test
# leaves out: docs/testing.md) at TXBRIDGE_SOAK_SCALE=SOAK_SCALE (1.0 is what make test runs).
SOAK_SCALE    ?= 3
# make test: pytest-xdist workers. Most of a test's time is waiting on Kafka, Spark or a
# subprocess, so three workers overlap those waits on a 2-core box (one for the Spark group,
# one for the secured cluster's, one for the rest; docs/testing.md); TEST_WORKERS=0 runs in-process.
TEST_WORKERS  ?= 3

# make matrix: the exactly-once black-box tests on each Kafka broker, pyspark and confluent-kafka
# version of docs/local-servers.md (scripts/matrix.py); MATRIX_SCOPE=ci runs one short test a case
# on the oldest and the newest only (what .ci/run runs); MATRIX_CASES=kafka-3.7.2,... picks cases.
MATRIX_SCOPE  ?= full
MATRIX_CASES  ?=
# make lock: the pyspark constraints.txt pins; the newest whose Kafka source jars Maven Central
# serves (servers/jars.py SPARK_KAFKA_SERVED), since the demo and the tests need them.
LOCK_PYSPARK  ?= 4.2.0

# The versions come from constraints.txt, so a fresh clone installs what CI ran; pip ignores
# constraints on packages not asked for. `make lock` refreshes the file on purpose.
$(STAMP): pyproject.toml constraints.txt
	@py=$$(scripts/check-prereqs.sh) || exit 1; \
	  if [ ! -x $(BIN)/python ]; then echo "creating $(VENV) with $$py"; $$py -m venv $(VENV); fi
	$(BIN)/python -m pip install -q --upgrade -c constraints.txt pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	@touch $(STAMP)

lock:
	@py=$$(scripts/check-prereqs.sh) || exit 1; scripts/lock.sh "$$py" $(LOCK_PYSPARK)

matrix: setup
	$(BIN)/python scripts/matrix.py --scope $(MATRIX_SCOPE) $(if $(MATRIX_CASES),--cases $(MATRIX_CASES)) $(ARGS)

system-packages:
	@scripts/system-packages.sh

setup: $(STAMP) system-packages
	$(BIN)/txbridge setup

demo: setup
	$(BIN)/txbridge demo $(ARGS)

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check --exclude '*.md' .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check --exclude '*.md' .
	$(BIN)/mypy
	$(BIN)/lint-imports

chaos: setup
	@seeds="$(CHAOS_SEEDS)"; \
	if [ -z "$$seeds" ]; then \
	  seeds=$$($(BIN)/python -c 'import random; print(",".join(str(random.randrange(10**6)) for _ in range($(CHAOS_RUNS))))'); \
	fi; \
	summary=$$(mktemp); \
	echo "chaos: seeds $$seeds, $(CHAOS_SECONDS)s each"; \
	TXBRIDGE_CHAOS_SEEDS=$$seeds TXBRIDGE_CHAOS_SECONDS=$(CHAOS_SECONDS) TXBRIDGE_CHAOS_SUMMARY=$$summary \
	  $(BIN)/pytest tests/secure/test_nemesis.py -s $(ARGS); status=$$?; \
	echo; echo "chaos: one line per run"; \
	for seed in $$(echo $$seeds | tr , ' '); do \
	  grep "^nemesis seed=$$seed " $$summary || echo "nemesis seed=$$seed: no count (it failed before; see above)"; \
	done; \
	rm -f $$summary; exit $$status

soak: setup
	TXBRIDGE_SOAK_SCALE=$(SOAK_SCALE) $(BIN)/pytest -m soak -s -o timeout=7200 $(ARGS)

bench: setup
	$(BIN)/txbridge bench $(ARGS)

# make console: the web console on the local broker (started if it is not running, its topics
# created), at http://127.0.0.1:8480/ (docs/console.md); ARGS="--admin-token-env NAME" enables actions.
console: $(STAMP)
	@$(BIN)/txbridge kafka status >/dev/null 2>&1 || $(BIN)/txbridge kafka start
	$(BIN)/txbridge init
	$(BIN)/txbridge console $(ARGS)

clean:
	-$(BIN)/txbridge kafka stop
	rm -rf $(VENV) .cache
