# Two commands on a fresh machine (Debian 12, root):  make demo  |  make test
VENV ?= .venv
PY := $(VENV)/bin/python
CLUSTER := scripts/slurm-dev-cluster
# The second Slurm the tests run on: built from source (cached in its prefix), with pyslurm.
NEW_SLURM ?= 25.11
NEW_PREFIX ?= /opt/slurm-$(NEW_SLURM)
SLURM_TARBALL ?= $(firstword $(wildcard ../shared/slurm-$(NEW_SLURM)/slurm-$(NEW_SLURM).*.tar.gz))
PYSLURM ?= pyslurm==25.11.2
include scripts/dev-cluster.env
export SLURM_CONF ?= $(or $(PSWIFT_CLUSTER_DIR),$(PSWIFT_DEV_DIR))/etc/slurm.conf

ARTIFACTS ?= test-artifacts
# pytest's options in every phase: the slowest 25 tests printed, results kept for the summary
PYTEST_CI = -q -p no:cacheprovider --durations=25 --junitxml=$(ARTIFACTS)/junit-$@.xml

.PHONY: setup tools cluster demo test test-fast test-fast-ci test-slurm-a test-slurm-b test-22.05 test-new slurm-new pyslurm bench stop gpu-check

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel first (any other spec may pull a multi-GB CUDA build), then the rest
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[train,test]'
	touch $@

setup: $(VENV)/.installed

# Debian's Chromium (the headless browser the dashboard test drives), the sqlite3 command (the
# baseline bench/history_scale.py measures the admin commands against) and Lua 5.1 and 5.3 (the
# languages slurmctld's job_submit/lua embeds: Debian's 22.05 links 5.1, the 25.11 build 5.3; the
# fast tier runs plugins/job_submit.lua in both)
tools:
	@command -v chromium >/dev/null && command -v sqlite3 >/dev/null && command -v lua5.3 >/dev/null && \
	  command -v lua5.1 >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    chromium sqlite3 lua5.1 lua5.3 >/dev/null; }

cluster: setup
	PSWIFT_PYTHON=$(abspath $(PY)) $(CLUSTER) start

# the example through `pswift sbatch` on the local Slurm, waiting for it and showing its loss
demo: cluster
	$(VENV)/bin/pswift sbatch --wait examples/tiny-gpt/train.toml

# The whole suite, each phase timed: the fast tier on both cores, then the Slurm and DeepSpeed
# tests in three streams side by side, each on a cluster of its own (their jobs mostly wait on
# Slurm, sleeps and each other: one stream alone left half the CPU idle): Debian's Slurm 22.05
# twice (the tests cut in two halves by file, SHARD_A's and the rest) and $(NEW_SLURM)'s tests
# marked every_version (version-sensitive ones and one smoke test per capability) or newest_only
# (long version-neutral ones that balance the streams: growth, the controller outage, the
# cluster benchmarks' quick runs). Ends with each
# phase's time, each stream's, and the totals of every phase.
test:
	@rm -rf $(ARTIFACTS)/phase-times.tsv $(ARTIFACTS)/junit-*.xml $(ARTIFACTS)/stream-*.log
	@scripts/timed "set-up (venv, tools, Slurm $(NEW_SLURM))" $(MAKE) --no-print-directory setup tools slurm-new pyslurm
	@scripts/timed "fast tier" $(MAKE) --no-print-directory test-fast-ci; rc=$$?; \
	  scripts/timed "Slurm tests: 3 streams side by side" $(MAKE) --no-print-directory -j3 --output-sync=target \
	    test-slurm-a test-slurm-b test-new; rc2=$$?; \
	  scripts/test-summary $(ARTIFACTS); [ $$rc -eq 0 ] && [ $$rc2 -eq 0 ]

# the Slurm tests' two halves on 22.05, by file: SHARD_A's files on the first cluster, the rest on
# the second, cut by a CI run's times per file (2026-12-06, streams side by side: SHARD_A's
# files 2407 s, the rest 2462 s, the 25.11 stream 868 s; then 1017 s of newest_only tests, 619 s
# of them from the second half, moved to 25.11). What one machine holds once (a configless
# slurmd's /run/slurm/conf) a test takes a lock for (tests/test_configless.py).
SHARD_A := tests/test_bench_quick.py tests/test_preemption.py tests/test_rebalance.py tests/test_interval.py \
           tests/test_admin.py tests/test_serve.py tests/test_metrics.py tests/test_history.py tests/test_microbatch.py
# the second 22.05 cluster: its folder and ports (scripts/dev-cluster.env)
SECOND_22 := PSWIFT_CLUSTER_DIR=$(PSWIFT_DEV_DIR)$(PSWIFT_DEV_SECOND_SUFFIX) \
             PSWIFT_CLUSTER_CTLD_PORT=$(PSWIFT_DEV_SECOND_CTLD_PORT) PSWIFT_CLUSTER_BASEPORT=$(PSWIFT_DEV_SECOND_BASEPORT)

test-fast-ci: setup tools
	PSWIFT_TEST_TIER=fast PSWIFT_REQUIRE_BROWSER=1 SLURM_CONF=/nonexistent/slurm.conf \
	  $(PY) -m pytest $(PYTEST_CI) -n 2 -m "not slurm and not deepspeed"

test-slurm-a: setup tools
	@start=$$(date +%s); PSWIFT_PYTHON=$(abspath $(PY)) scripts/with-slurm 22.05 $(CLUSTER) start; \
	  PSWIFT_REQUIRE_BROWSER=1 scripts/with-slurm 22.05 $(PY) -m pytest $(PYTEST_CI) --basetemp=/tmp/pswift-tests-a \
	    -m "(slurm or deepspeed) and not newest_only" $(SHARD_A); rc=$$?; \
	  echo "== stream a (Slurm 22.05, first cluster): $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

test-slurm-b: setup tools
	@start=$$(date +%s); $(SECOND_22) PSWIFT_PYTHON=$(abspath $(PY)) scripts/with-slurm 22.05 $(CLUSTER) start; \
	  $(SECOND_22) PSWIFT_REQUIRE_BROWSER=1 scripts/with-slurm 22.05 $(PY) -m pytest $(PYTEST_CI) --basetemp=/tmp/pswift-tests-b \
	    -m "(slurm or deepspeed) and not newest_only" $(addprefix --ignore=,$(SHARD_A)); rc=$$?; \
	  echo "== stream b (Slurm 22.05, second cluster): $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

# the edit loop: every test that needs neither a Slurm cluster nor DeepSpeed across processes
# (no daemon is started: a test that asks for a cluster fails here); a few minutes
test-fast: setup
	@command -v lua5.3 >/dev/null && command -v lua5.1 >/dev/null || $(MAKE) --no-print-directory tools
	PSWIFT_TEST_TIER=fast SLURM_CONF=/nonexistent/slurm.conf $(PY) -m pytest -q -p no:cacheprovider --durations=10 -n 2 -m "not slurm and not deepspeed"

# every test: the fast tier first, on both cores (pytest-xdist: its tests share no daemon, port
# or file), then the Slurm and DeepSpeed tests one at a time (they share the cluster's nodes)
test-22.05: setup tools
	PSWIFT_PYTHON=$(abspath $(PY)) scripts/with-slurm 22.05 $(CLUSTER) start
	rc=0; PSWIFT_TEST_TIER=fast PSWIFT_REQUIRE_BROWSER=1 SLURM_CONF=/nonexistent/slurm.conf \
	  $(PY) -m pytest $(PYTEST_CI:$@.xml=$@-fast.xml) -n 2 -m "not slurm and not deepspeed" || rc=$$?; \
	  PSWIFT_REQUIRE_BROWSER=1 scripts/with-slurm 22.05 $(PY) -m pytest $(PYTEST_CI) -m "slurm or deepspeed" || rc=$$?; \
	  exit $$rc

test-new: setup slurm-new pyslurm
	@start=$$(date +%s); PSWIFT_PYTHON=$(abspath $(PY)) scripts/with-slurm $(NEW_SLURM) $(CLUSTER) start; \
	  PSWIFT_REQUIRE_PYSLURM=1 scripts/with-slurm $(NEW_SLURM) $(PY) -m pytest $(PYTEST_CI) --basetemp=/tmp/pswift-tests-new \
	    -m "(slurm and every_version) or newest_only"; rc=$$?; \
	  echo "== stream new (Slurm $(NEW_SLURM)): $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc

# Slurm $(NEW_SLURM): unpacked from ../shared/slurm-$(NEW_SLURM)/prebuilt/ when its sha256 is the one
# scripts/build-slurm pins (seconds, pyslurm included), else built from its source tarball
# (~14 min with pyslurm); skipped when $(NEW_PREFIX) has it
slurm-new:
	@[ -n "$(SLURM_TARBALL)" ] || { echo "no Slurm $(NEW_SLURM) source tarball: set SLURM_TARBALL=/path/slurm-$(NEW_SLURM).N.tar.gz" >&2; exit 2; }
	scripts/build-slurm $(SLURM_TARBALL) $(NEW_PREFIX)

# pyslurm built against that Slurm, kept beside it ($(NEW_PREFIX)/python; with-slurm puts it on PYTHONPATH)
pyslurm: slurm-new setup
	@if [ ! -f $(NEW_PREFIX)/python/.installed ]; then \
	  echo "building $(PYSLURM) against $(NEW_PREFIX) (about 5 minutes)..."; \
	  SLURM_INCLUDE_DIR=$(NEW_PREFIX)/include SLURM_LIB_DIR=$(NEW_PREFIX)/lib \
	    $(PY) -m pip install -q --no-deps --target $(NEW_PREFIX)/python $(PYSLURM) && touch $(NEW_PREFIX)/python/.installed; \
	fi

# every benchmark, full size, each writing bench/results/NAME.json (CI runs them in quick mode
# through tests/test_bench_quick.py), then docs/benchmarks.md's table from those files
bench: setup tools
	for b in simulator partition history_scale plan_worst_case job_submit ingest_cap checkpoint step_time_model overhead schedules gloo_posted; do \
	  $(PY) bench/$$b.py || exit 1; done
	PSWIFT_PYTHON=$(abspath $(PY)) scripts/with-slurm 22.05 $(CLUSTER) start
	scripts/with-slurm 22.05 $(PY) bench/submit_latency.py
	scripts/with-slurm 22.05 $(PY) bench/dynamic.py
	scripts/with-slurm 22.05 $(PY) bench/goodput.py
	scripts/with-slurm 22.05 $(PY) bench/workload.py --trace ../shared/traces/nasa-ipsc-1993.swf.gz --window 3600 --compression 12 --train-min-size 16
	$(MAKE) slurm-new pyslurm
	PSWIFT_PYTHON=$(abspath $(PY)) scripts/with-slurm $(NEW_SLURM) $(CLUSTER) start
	scripts/with-slurm $(NEW_SLURM) $(PY) bench/slurm_backends.py
	scripts/with-slurm $(NEW_SLURM) $(PY) bench/goodput.py --out bench/results/goodput.slurm-25.11.json
	scripts/with-slurm $(NEW_SLURM) $(PY) bench/members.py --rounds 6
	scripts/with-slurm $(NEW_SLURM) $(PY) bench/workload.py --trace ../shared/traces/nasa-ipsc-1993.swf.gz --window 3600 --compression 12 --train-min-size 16 --seed 8 --policies P,M --out bench/results/workload-nasa-ipsc-1993.members.json --picture /tmp/workload-members.png
	$(PY) bench/readme.py

# what only a GPU machine can check (nccl, bf16/fp16 with ZeRO-1, the memory model, a 2 -> 1 stage
# resume), one table, within 8 minutes; one line and exit 0 where there is no GPU
gpu-check: setup
	$(PY) scripts/gpu-check

# every dev cluster of both versions, the tests' accounting clusters (*-acct) too
stop:
	-scripts/with-slurm 22.05 $(CLUSTER) stop
	-PSWIFT_CLUSTER_DIR=$(PSWIFT_DEV_DIR)$(PSWIFT_DEV_ACCT_SUFFIX) scripts/with-slurm 22.05 $(CLUSTER) stop
	-[ ! -x $(NEW_PREFIX)/sbin/slurmctld ] || scripts/with-slurm $(NEW_SLURM) $(CLUSTER) stop
	-[ ! -x $(NEW_PREFIX)/sbin/slurmctld ] || PSWIFT_CLUSTER_DIR=$(PSWIFT_DEV_DIR)-$(NEW_SLURM)$(PSWIFT_DEV_ACCT_SUFFIX) scripts/with-slurm $(NEW_SLURM) $(CLUSTER) stop
	-PSWIFT_CLUSTER_DIR=$(PSWIFT_DEV_DIR)$(PSWIFT_DEV_CONFIGLESS_SUFFIX) scripts/with-slurm 22.05 $(CLUSTER) stop
	-$(SECOND_22) scripts/with-slurm 22.05 $(CLUSTER) stop
	-PSWIFT_CLUSTER_DIR=$(PSWIFT_DEV_DIR)$(PSWIFT_DEV_SECOND_SUFFIX)$(PSWIFT_DEV_ACCT_SUFFIX) scripts/with-slurm 22.05 $(CLUSTER) stop
	-PSWIFT_CLUSTER_DIR=$(PSWIFT_DEV_DIR)$(PSWIFT_DEV_SECOND_SUFFIX)$(PSWIFT_DEV_CONFIGLESS_SUFFIX) scripts/with-slurm 22.05 $(CLUSTER) stop
	-[ ! -x $(NEW_PREFIX)/sbin/slurmctld ] || PSWIFT_CLUSTER_DIR=$(PSWIFT_DEV_DIR)-$(NEW_SLURM)$(PSWIFT_DEV_CONFIGLESS_SUFFIX) scripts/with-slurm $(NEW_SLURM) $(CLUSTER) stop
