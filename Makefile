# xbench -- `make run` and `make test` each set everything up on a fresh machine.
PYTHON     ?= python3
VENV       ?= .venv
# Installed first so that no dependency pulls a CUDA build; override for GPU machines,
# e.g. make install TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
ARGS       ?=
BIN        := $(VENV)/bin
STAMP      := $(VENV)/.xbench-installed
TEST_WORKERS ?= 2

.PHONY: help install run test test-full study table references time-rows clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(STAMP)  ## create .venv with torch (CPU by default) and xbench

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e ".[dev,slurm,bench]"
	touch $(STAMP)

run: install  ## train the default experiment (offline, ~2 min on a laptop CPU); ARGS="key=value ..."
	$(BIN)/xbench $(ARGS)

test: install  ## the test suite (CPU, offline, < 10 min: two workers, one test file each at a time)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-full: install  ## every test, slow ones included
	$(BIN)/python -m pytest -q -m "" -n $(TEST_WORKERS) --dist loadfile

study: install  ## a whole study: make study EXPERIMENT=narang_activations (finished runs are skipped)
	$(BIN)/xbench -m experiment=$(EXPERIMENT) $(ARGS)

table: TABLE_RESULTS := results
table: install  ## your runs: results/ (less reference/, bench/) -> tables + plots in results/tables/ (xbench-table --help)
	@$(BIN)/xbench-table --results-dir $(TABLE_RESULTS) --out $(TABLE_RESULTS)/tables --allow-empty

references: TABLE_RESULTS := results
references: install  ## re-render each shipped results/reference/<name>/records into its folder (a few minutes)
	@status=0; for records in $(TABLE_RESULTS)/reference/*/records; do [ -d "$$records" ] || continue; \
	  if [ -f "$${records%/records}/INCOMPLETE" ]; then \
	    echo "skip $${records%/records}: $$(head -1 $${records%/records}/INCOMPLETE)"; continue; fi; \
	  echo "$$records -> $${records%/records}"; \
	  $(BIN)/xbench-table --results-dir $$records --out $${records%/records} >/dev/null \
	    || { echo "error: $$records: the tables failed (above)" >&2; status=1; }; done; exit $$status

time-rows: install  ## time each row of a study alone (the table's Step/s): make time-rows EXPERIMENT=...
	$(BIN)/python -m xformer_bench.bench.row_timing --results-dir results --experiment $(EXPERIMENT) $(ARGS)

clean:  ## remove run outputs and caches (keeps .venv, data/ and results/)
	rm -rf outputs multirun lightning_logs .pytest_cache build *.egg-info
	find . -name __pycache__ -not -path "./$(VENV)/*" -prune -exec rm -rf {} +
