# Two commands on a fresh machine (Debian 12, root):  make demo  |  make test
VENV ?= .venv
PY := $(VENV)/bin/python
CLUSTER := scripts/slurm-dev-cluster
export SLURM_CONF ?= $(or $(PSWIFT_CLUSTER_DIR),/tmp/pswift-dev-cluster)/etc/slurm.conf

.PHONY: setup cluster demo test bench stop

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel first (any other spec may pull a multi-GB CUDA build), then the rest
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[train,test]'
	touch $@

setup: $(VENV)/.installed

cluster: setup
	PSWIFT_PYTHON=$(abspath $(PY)) $(CLUSTER) start

# the example through `pswift sbatch` on the local Slurm, waiting for it and showing its loss
demo: cluster
	$(VENV)/bin/pswift sbatch --wait examples/tiny-gpt/train.toml

test: cluster
	$(PY) -m pytest -q

stop:
	$(CLUSTER) stop
