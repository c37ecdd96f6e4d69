# make install | chat | test | test-fast | test-laws | bench | bench-host | bench-peers | pair | big-pair | qat-draft | qat-draft-all | lint        (see README.md)
PYTHON ?= python3
VENV ?= .venv
LLAMA_CPP_VERSION ?= 0.3.36
EXTRAS ?= gguf,demo,dev,export,onnx,serve,desktop,grammar
# without an NVIDIA GPU, take torch's CPU wheel; an unpinned torch would pull a CUDA build of several GB
TORCH_CPU ?= torch==2.13.0
PAIR_DIR ?= models
# GPU=cuda|metal|vulkan|cpu: the backend llama.cpp is built for beside the CPU (default cpu). The CPU flags stay:
# a native build segfaults in ggml's AMX kernels on some CPUs, so -DGGML_NATIVE=OFF is added unless CMAKE_ARGS
# (the environment's, added last) sets GGML_NATIVE itself. GPU=cuda also swaps onnxruntime for onnxruntime-gpu.
GPU ?= cpu
GPU_FLAGS_cpu :=
GPU_FLAGS_cuda := -DGGML_CUDA=ON
GPU_FLAGS_metal := -DGGML_METAL=ON
GPU_FLAGS_vulkan := -DGGML_VULKAN=ON
ifeq ($(filter $(GPU),cpu cuda metal vulkan),)
$(error GPU=$(GPU): choose cuda, metal, vulkan or cpu)
endif
export CMAKE_ARGS := $(strip $(if $(findstring GGML_NATIVE,$(CMAKE_ARGS)),,-DGGML_NATIVE=OFF) \
	$(GPU_FLAGS_$(GPU)) $(CMAKE_ARGS))

PY := $(VENV)/bin/python
STAMP := $(VENV)/.edgespec-installed-$(shell cat pyproject.toml Makefile scripts/llama-wheel.sh | { cat; echo "$(CMAKE_ARGS) $(EXTRAS) $(GPU)"; } | sha256sum | cut -c1-12)

.PHONY: install chat test test-fast test-laws bench bench-pair bench-memory bench-host bench-peers pair big-pair qat-draft qat-draft-all lint clean

install: $(STAMP)

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# llama-cpp-python first, from our own wheel cache keyed by version and CMAKE_ARGS
	$(PY) -m pip install --quiet "$$(scripts/llama-wheel.sh $(PY) $(LLAMA_CPP_VERSION))"
	@if ! command -v nvidia-smi >/dev/null 2>&1; then echo "$(PY) -m pip install $(TORCH_CPU)"; \
		$(PY) -m pip install --quiet "$(TORCH_CPU)"; fi
	@# the C row passes (edgespec/decode/_rows.c, the production path for wide rows) compile against the Python
	@# headers; where the distribution left them out, its pythonX.Y-dev package brings them before the build (without
	@# them the passes fall back to numpy and tests/fast/test_rows.py fails under CI=true)
	@$(PY) -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" || \
		(export DEBIAN_FRONTEND=noninteractive; v=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
		apt-get update -qq && apt-get install -y -qq "python$$v-dev" >/dev/null) || \
		echo "no Python headers: the C row passes fall back to numpy (tests/fast/test_rows.py fails under CI)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@# the chat page's browser test drives the distribution's Chromium; where it cannot be installed (no apt, not
	@# root, offline) the build goes on and tests/real/test_page.py skips, saying why (under CI=true it fails)
	@command -v chromium >/dev/null 2>&1 || (export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
		apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: tests/real/test_page.py will skip (fail under CI)"
	@# onnxruntime-gpu holds the same module with the CUDA provider: one of the two, the same version
	@if [ "$(GPU)" = cuda ] && $(PY) -m pip show onnxruntime >/dev/null 2>&1; then \
		v=$$($(PY) -m pip show onnxruntime | sed -n 's/^Version: //p'); \
		$(PY) -m pip uninstall --quiet -y onnxruntime && $(PY) -m pip install --quiet "onnxruntime-gpu==$$v"; fi
	@rm -f $(VENV)/.edgespec-installed-*
	@touch $@

chat: install
	$(VENV)/bin/edgespec chat

# the whole suite on a worker a core, up to 4 (pytest-xdist), a test file at a time (a module's fixtures built once);
# tests/conftest.py schedules the files and gives each worker its share of the cores, which its threads keep to
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
test: install
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS)

# the tiers (docs/testing.md): tests/fast (pure functions, the loop on fakes: under a minute), tests/laws
test-fast: install
	$(VENV)/bin/python -m pytest -q tests/fast --durations=5

test-laws: install
	$(VENV)/bin/python -m pytest -q tests/laws --durations=5

bench: install
	$(VENV)/bin/edgespec bench

# the bandwidth-bound reference pair: SmolLM2-135M f32 target + q4_0 draft, exported from the
# default model's checkpoint (rebuilt offline), with parity reports beside the files
PAIR := $(PAIR_DIR)/smollm2-f32-q4_0/pair.json
pair: $(PAIR)

$(PAIR): | install
	$(VENV)/bin/edgespec default-checkpoint $(PAIR_DIR)/smollm2-135m-instruct-hf
	$(VENV)/bin/edgespec export-pair --target $(PAIR_DIR)/smollm2-135m-instruct-hf \
		--draft $(PAIR_DIR)/smollm2-135m-instruct-hf --to gguf --target-quant f32 --draft-quant q4_0 \
		--out $(dir $(PAIR))

# the f32 target's own Q4_0, trained through its rounding to agree with it, on its answers to 585 of the built-in
# training prompts (every third of each category, at most 100): about 35 minutes on 2 CPU cores
QAT_DRAFT := $(dir $(PAIR))draft-qat-q4_0.gguf
qat-draft: $(QAT_DRAFT)

$(QAT_DRAFT): | pair
	$(PY) -m edgespec.train.prompts --every 3 --at-most 100 > $(PAIR_DIR)/qat-prompts.jsonl
	$(VENV)/bin/edgespec distill --target $(dir $(PAIR))target-f32.gguf --source $(PAIR_DIR)/smollm2-135m-instruct-hf \
		--prompts $(PAIR_DIR)/qat-prompts.jsonl --only-prompts --layers 30 --quant q4_0 --quant-aware --epochs 2 \
		--lr 1e-4 --out $@

# that draft, one more epoch with the f32 target's answers to the other 1210 built-in training prompts beside
# the first 585: about 31 minutes of answers and 20 of training on 2 CPU cores
QAT_DRAFT_ALL := $(dir $(PAIR))draft-qat2-q4_0.gguf
qat-draft-all: $(QAT_DRAFT_ALL)

$(QAT_DRAFT_ALL): | qat-draft
	$(PY) -m edgespec.train.prompts --except $(PAIR_DIR)/qat-prompts.jsonl > $(PAIR_DIR)/rest-prompts.jsonl
	$(VENV)/bin/edgespec distill --target $(dir $(PAIR))target-f32.gguf --source $(PAIR_DIR)/smollm2-135m-instruct-hf \
		--prompts $(PAIR_DIR)/rest-prompts.jsonl --only-prompts --also-corpus $(QAT_DRAFT:.gguf=.corpus) \
		--init $(QAT_DRAFT:.gguf=.hf) --layers 30 --quant q4_0 --quant-aware --epochs 1 --lr 1e-4 --out $@

# the reference target widened with zero weights to a 2B-class f16 (2048 wide, 3.6 GiB) and a 7B-class Q8_0
# (4096 wide, 6.7 GiB): a big model's cost with the reference target's text, the pair's q4_0 as their draft
# (edgespec/models/widen.py; docs/drafts.md, "Widened targets"); a minute or two each on 2 CPU cores
BIG_2B := $(dir $(PAIR))target-2b-f16.gguf
BIG_7B := $(dir $(PAIR))target-7b-q8_0.gguf
big-pair: $(BIG_2B) $(BIG_7B)

$(BIG_2B): | pair
	$(PY) -m edgespec.models.widen $(dir $(PAIR))target-f32.gguf $@ --shape 2b --type f16

$(BIG_7B): | pair
	$(PY) -m edgespec.models.widen $(dir $(PAIR))target-f32.gguf $@ --shape 7b --type q8_0

bench-pair: pair
	$(VENV)/bin/edgespec bench --pair $(PAIR) -t 0
	$(VENV)/bin/edgespec bench --pair $(PAIR) -t 0.7

# the runtime's own work per token (docs/results/2026-11-26-loop-at-device-speed.md): the loop over rows only, at
# 32k-152k vocabularies, then edgespec target-only against llama-cpp-python's generate on the default model and on a
# random-weight model with a 152k vocabulary
RANDOM_152K := $(PAIR_DIR)/random-135m-152064-f16.gguf
bench-host: install
	$(PY) benchmarks/loop_overhead.py
	test -f $(RANDOM_152K) || $(PY) -m edgespec.models.random_gguf $(RANDOM_152K) --shape 135m --vocab 152064
	$(PY) benchmarks/vs_llama_cpp_python.py
	$(PY) benchmarks/vs_llama_cpp_python.py --model $(RANDOM_152K)

# edgespec against llama-server (plain, with the pair's draft, with prompt lookup) on the reference pair, interleaved;
# builds llama-server from the vendored llama.cpp on first use (benchmarks/vs_llama_cpp.py)
bench-peers: pair
	$(PY) benchmarks/vs_llama_cpp.py --pair $(PAIR)

bench-memory: pair
	$(PY) benchmarks/memory.py --pair $(PAIR)

lint: install
	$(VENV)/bin/ruff check edgespec tests benchmarks experiments apps

clean:
	rm -rf $(VENV) build *.egg-info
