# Two commands on a fresh machine: `make run` and `make test`. Both create the virtualenv
# and install dqtool into it first, from requirements.lock: the exact versions (with hashes)
# the suite has passed with. pyproject.toml keeps the ranges a library user installs with.
#   make lock         refresh requirements.lock from the newest releases in those ranges
#   make test-latest  the suite against the newest releases, in .venv-latest, with a report
#                     of what differs from the lock (drift shows up here, not in a fresh clone)
#   make test-ort ORT=1.31.1   the suite on the locked set with another onnxruntime
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
OUT    := out
LOCK   := requirements.lock
PIP    := -m pip install --quiet --disable-pip-version-check
PYTEST := -m pytest -n 2 -q -p no:cacheprovider
UV     := uv==0.13.9
ORT    ?= 1.31.1
# Hypothesis and size tests run small by default; `make test DQTOOL_SLOW=1` runs them bigger.
export DQTOOL_SLOW ?=
# `make fuzz` (docs/safety.md): a campaign of this many seconds from this seed; failing
# inputs are saved to tests/fuzz_regressions/. `make test` runs a 30 s one
# (DQTOOL_FUZZ_SECONDS, DQTOOL_FUZZ_SEED).
FUZZ_SECONDS ?= 300
FUZZ_SEED ?= 0

.PHONY: run test browser lint models docs bench bench-quick fuzz clean lock test-latest test-ort test-cpu

# $(1): the virtualenv folder. Installs the lock (hash-checked), then dqtool itself, built
# with the locked setuptools (no build isolation: nothing unpinned is fetched), which
# compiles the kernels of dqtool/native (setup.py) where there is a C compiler.
define install_locked
	@test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python $(PIP) --require-hashes -r $(LOCK)
	$(1)/bin/python $(PIP) --no-deps --no-build-isolation -e .
endef

$(STAMP): pyproject.toml setup.py $(LOCK) $(wildcard dqtool/native/*.c dqtool/native/*.h)
	$(call install_locked,$(VENV))
	@# An editable install leaves dqtool's own bytecode to the first run, which may not write
	@# it (PYTHONDONTWRITEBYTECODE): compiled here, every command starts ~0.1 s sooner.
	$(BIN)/python -m compileall -q dqtool
	@# Whether the install above built the compiled kernels; without a C compiler it goes
	@# on without them and dqtool runs on NumPy (the same bytes, slower).
	$(BIN)/python -c "from dqtool.native import describe; print('native kernels', describe())"
	@touch $(STAMP)

run: $(STAMP)
	@mkdir -p $(OUT)
	$(BIN)/dqtool inspect models/ort_qdq_contrib.onnx
	$(BIN)/dqtool upgrade models/ort_qdq_contrib.onnx --opset 21 -o $(OUT)/ort_qdq_contrib.opset21.onnx
	$(BIN)/dqtool check $(OUT)/ort_qdq_contrib.opset21.onnx --against models/ort_qdq_contrib.onnx
	$(BIN)/dqtool fold models/ort_qdq_per_channel.onnx -o $(OUT)/ort_qdq_per_channel.folded.onnx
	$(BIN)/dqtool check $(OUT)/ort_qdq_per_channel.folded.onnx --against models/ort_qdq_per_channel.onnx
	$(BIN)/dqtool lint models/ort_qdq_per_channel.onnx --target onnxruntime

test: $(STAMP) browser
	$(BIN)/python $(PYTEST)

# Debian's headless Chromium opens the HTML reports in tests/test_check_report.py. Installed
# where the machine lets us (root, Debian's registry); elsewhere those tests skip, and say so.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    chromium) >/dev/null 2>&1 || echo "chromium not installed: the HTML report tests skip"; }

lock: $(STAMP)
	$(BIN)/python $(PIP) $(UV)
	$(BIN)/uv pip compile pyproject.toml --extra dev --group build --generate-hashes \
	  --python-version 3.11 --python-platform x86_64-manylinux_2_35 --no-header --quiet \
	  --upgrade -o $(LOCK)
	@echo "requirements.lock refreshed: run 'make test' (it reinstalls from the lock) before committing it"

test-latest:
	@test -x .venv-latest/bin/python || $(PYTHON) -m venv .venv-latest
	.venv-latest/bin/python $(PIP) --upgrade --upgrade-strategy eager -e '.[dev]'
	@.venv-latest/bin/python tools/lock_drift.py $(LOCK)
	.venv-latest/bin/python $(PYTEST)

test-ort:
	$(call install_locked,.venv-ort-$(ORT))
	.venv-ort-$(ORT)/bin/python $(PIP) onnxruntime==$(ORT)
	@.venv-ort-$(ORT)/bin/python tools/lock_drift.py $(LOCK)
	.venv-ort-$(ORT)/bin/python $(PYTEST)

# `make test-cpu CPU=Haswell`: the integer, check and docs tests with onnxruntime on another
# CPU code path, emulated by qemu-user (Debian package qemu-user, installed here if missing):
# Haswell is x86-64 AVX2 without VNNI (docs/semantics.md "CPU code paths").
# `make test-cpu CPU=neoverse-n1`: the same tests on ARM64 (arm64-dotprod) under
# qemu-aarch64, in an aarch64 Python that tools/arm64_sysroot.py builds once from Debian's
# arm64 packages and the lock's aarch64 wheels (.cpu-emulation/arm64, reused after).
# The Neoverse N1 only: under -cpu cortex-a72 (arm64-neon) onnxruntime 1.32.0 stops on an
# illegal instruction in the runtime probe's DequantizeLinear sessions (2026-11-28).
CPU ?= Haswell
ARM_CPUS := neoverse-n1
CPU_TESTS ?= tests/test_integer_*.py tests/test_check*.py tests/test_docs.py tests/test_code_paths.py
test-cpu: $(STAMP)
	@command -v qemu-x86_64 >/dev/null && command -v qemu-aarch64 >/dev/null \
	  || (apt-get update -qq && apt-get install -y -qq qemu-user)
ifeq ($(filter $(CPU),$(ARM_CPUS)),)
	@tools/python-on-cpu $(CPU) $(abspath $(BIN))/python > $(BIN)/python-$(CPU)
	@chmod +x $(BIN)/python-$(CPU)
else
	@ln -sf "$$($(BIN)/python tools/arm64_sysroot.py $(CPU))" $(BIN)/python-$(CPU)
endif
	@$(BIN)/python-$(CPU) -c "from dqtool.runtimes import cpu_path; print('CPU path under qemu:', cpu_path.probe().describe())"
ifeq ($(filter $(CPU),$(ARM_CPUS)),)
	$(BIN)/python -m pytest -q -p no:cacheprovider --dist load \
	  --tx "2*popen//python=$(abspath $(BIN))/python-$(CPU)" $(CPU_TESTS)
else
	@# xdist hands its workers the controller's sys.path: the controller is the aarch64
	@# Python too (the wrapper runs it at nice 19, and its workers through sys.executable)
	$(BIN)/python-$(CPU) -m pytest -q -p no:cacheprovider -n 2 $(CPU_TESTS)
endif

lint: $(STAMP)
	$(BIN)/ruff check .

models: $(STAMP)
	$(BIN)/python models/build.py

# The generated parts of docs/: the lint rule table and every documented example's output.
docs: $(STAMP)
	$(BIN)/python docs/build.py

bench: $(STAMP)
	@$(BIN)/python -m compileall -q dqtool
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

bench-quick: $(STAMP)
	@$(BIN)/python -m compileall -q dqtool
	@for b in bench/bench_*.py; do echo "== $$b"; DQTOOL_BENCH_QUICK=1 $(BIN)/python $$b || exit 1; done

fuzz: $(STAMP)
	$(BIN)/python -m tools.fuzz --seconds $(FUZZ_SECONDS) --seed $(FUZZ_SEED)

clean:
	rm -rf $(OUT) .pytest_cache .ruff_cache .hypothesis
