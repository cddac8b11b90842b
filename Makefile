# Two commands on a fresh machine: `make run` and `make test`. Both create the virtualenv
# and install dqtool into it first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
OUT    := out
# Hypothesis and size tests run small by default; `make test DQTOOL_SLOW=1` runs them bigger.
export DQTOOL_SLOW ?=

.PHONY: run test lint models bench bench-quick clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@# An editable install leaves dqtool's own bytecode to the first run, which may not write
	@# it (PYTHONDONTWRITEBYTECODE): compiled here, every command starts ~0.1 s sooner.
	$(BIN)/python -m compileall -q dqtool
	@touch $(STAMP)

run: $(STAMP)
	@mkdir -p $(OUT)
	$(BIN)/dqtool inspect models/ort_qdq_contrib.onnx
	$(BIN)/dqtool upgrade models/ort_qdq_contrib.onnx --opset 21 -o $(OUT)/ort_qdq_contrib.opset21.onnx
	$(BIN)/dqtool check $(OUT)/ort_qdq_contrib.opset21.onnx --against models/ort_qdq_contrib.onnx
	$(BIN)/dqtool fold models/ort_qdq_per_channel.onnx -o $(OUT)/ort_qdq_per_channel.folded.onnx
	$(BIN)/dqtool check $(OUT)/ort_qdq_per_channel.folded.onnx --against models/ort_qdq_per_channel.onnx
	$(BIN)/dqtool lint models/ort_qdq_per_channel.onnx --target onnxruntime

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .

models: $(STAMP)
	$(BIN)/python models/build.py

bench: $(STAMP)
	@$(BIN)/python -m compileall -q dqtool
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

bench-quick: $(STAMP)
	@$(BIN)/python -m compileall -q dqtool
	@for b in bench/bench_*.py; do echo "== $$b"; DQTOOL_BENCH_QUICK=1 $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(OUT) .pytest_cache .ruff_cache .hypothesis
