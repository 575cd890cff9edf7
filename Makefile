# gdn_tvm — every target that needs the package depends on the venv.
PY      := .venv/bin/python
STAMP   := .venv/.installed
PYTEST  := $(PY) -m pytest
JOBS    ?= 2

.PHONY: help install tune build generate test test-gpu bench report bench-prebuild lint format clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install gdn_tvm editable with its pinned dependencies

tune: $(STAMP)  ## MetaSchedule-tune the ops a decode step launches (default preset, B=1; GPU if present, else llvm) into tuning_logs/; ARGS="--help"
	$(PY) -m gdn_tvm.tuning $(ARGS)

build: $(STAMP)  ## apply tuning_logs/ strictly, export build/<target>/<preset>-B<B>-S<S>-L<L>-sl<split>-<mapping>/ (.so + manifest); ARGS="--help"
	$(PY) -m gdn_tvm.export $(ARGS)

generate: $(STAMP)  ## decode with the whole model (a checkpoint, or a preset's random weights); ARGS="--help"
	$(PY) -m gdn_tvm.generate $(ARGS)

test: $(STAMP)  ## CPU (llvm) and compile-only CUDA tests; GPU tests are skipped without a GPU
	$(PYTEST) -n $(JOBS) -q

test-gpu: $(STAMP)  ## the GPU tests only (marker gpu), on a CUDA GPU
	$(PYTEST) -q -m gpu

RESULTS  ?= build/results
PREBUILT  = $(if $(wildcard build/bench/hand),--library build/bench/hand) $(if $(wildcard build/bench/tuned),--tuned build/bench/tuned)
DLIGHT    = $(if $(wildcard build/bench/dlight),--dlight-library build/bench/dlight,--dlight)

bench: $(STAMP)  ## GPU benchmarks (ops, decode steps; `make bench-prebuild` modules where built) -> build/results/ (JSON, tables)
	mkdir -p $(RESULTS)
	$(PY) -m benchmarks.run $(PREBUILT) $(DLIGHT) --out $(RESULTS)/ops.json
	$(PY) -m benchmarks.steps $(PREBUILT) --out $(RESULTS)/steps.json
	$(PY) -m benchmarks.report --results $(RESULTS) --doc $(RESULTS)/benchmarks.md

report: $(STAMP)  ## docs/benchmarks.md and docs/roofline.png from the committed H200 runs in benchmarks/results/
	$(PY) -m benchmarks.report

bench-prebuild: $(STAMP)  ## prebuild the benchmarks' CUDA modules (hand; tuned where logs exist) here (pinned NVRTC) into .device/bench.tar.xz
	$(PY) -m benchmarks.prebuild --out build/bench
	mkdir -p .device && tar cJf .device/bench.tar.xz -C build bench

lint: $(STAMP)  ## ruff check, format check, mypy (CI runs it)
	$(PY) -m ruff check gdn_tvm schedules tests benchmarks
	$(PY) -m ruff format --check gdn_tvm schedules tests benchmarks
	$(PY) -m mypy

format: $(STAMP)  ## ruff format and autofix
	$(PY) -m ruff format gdn_tvm schedules tests benchmarks
	$(PY) -m ruff check --fix gdn_tvm schedules tests benchmarks

clean:  ## remove build outputs (keeps .venv and tuning logs)
	rm -rf build .pytest_cache
