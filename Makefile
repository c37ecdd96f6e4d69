# make install | chat | test | bench | lint        (see README.md)
PYTHON ?= python3
VENV ?= .venv
LLAMA_CPP_VERSION ?= 0.3.36
EXTRAS ?= gguf,demo,dev
# the llama-cpp-python build flags; a native build segfaults in ggml's AMX kernels on some CPUs
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF

PY := $(VENV)/bin/python
STAMP := $(VENV)/.edgespec-installed-$(shell cat pyproject.toml Makefile scripts/llama-wheel.sh | { cat; echo "$(CMAKE_ARGS) $(EXTRAS)"; } | sha256sum | cut -c1-12)

.PHONY: install chat test bench lint clean

install: $(STAMP)

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# llama-cpp-python first, from our own wheel cache keyed by version and CMAKE_ARGS
	$(PY) -m pip install --quiet "$$(scripts/llama-wheel.sh $(PY) $(LLAMA_CPP_VERSION))"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@rm -f $(VENV)/.edgespec-installed-*
	@touch $@

chat: install
	$(VENV)/bin/edgespec chat

test: install
	$(VENV)/bin/python -m pytest

bench: install
	$(VENV)/bin/edgespec bench

lint: install
	$(VENV)/bin/ruff check edgespec tests

clean:
	rm -rf $(VENV) build *.egg-info
