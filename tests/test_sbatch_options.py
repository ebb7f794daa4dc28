"""Arguments given after `pswift sbatch ... --` read as sbatch's getopt_long reads them (unique
prefixes, values in the next argument, short-option clusters): what contradicts the plan or
breaks a pswift job is refused with its reason and the TOML key, the rest passes unchanged.
The same refusals through real sbatch are in test_slurm_e2e.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeswift_slurm.config import load_config
from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.planning.build import time_limits
from pipeswift_slurm.planning.build import options_for
from pipeswift_slurm.slurm import sbatch
from pipeswift_slurm.slurm.sbatch import SBATCH_FLAGS, SBATCH_SHORT, SBATCH_TAKES_VALUE, planned_option, sbatch_options

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-gpt"


@pytest.mark.parametrize("args,needle", [
    (("--part=high",), "planned --partition"),
    (("--parti", "high"), "planned --partition"),
    (("-HN3",), "planned --nodes"),                 # -H, then -N's value
    (("-t5",), "planned --time"),
    (("--no-requeue",), "[job] max_requeues"),
    (("--no-r",), "[job] max_requeues"),
    (("--sig=USR1@60",), "USR2 before the time limit"),
    (("--signal", "USR2@60"), "USR2 before the time limit"),
    (("-o", "/dev/null"), "slurm-%j.out"),
    (("-e/tmp/err",), "slurm-%j.out"),
    (("--open-mode=truncate",), "appends to one log"),
    (("--wrap=true",), "writes the batch script itself"),
    (("-a", "1-3"), "share one run directory"),
])
def test_what_contradicts_the_plan_or_breaks_the_job_is_refused(args, needle):
    why = planned_option(args)
    assert why is not None and needle in why, why


@pytest.mark.parametrize("args", [
    ("--comment", "--nodes=3"),          # --comment takes the next argument: a comment
    ("-J", "--partition=high"),          # a job name
    ("--com=x", "--mail-type", "END", "--hold"),
    ("--qos=high", "-A", "proj", "--requeue"),
    ("--o", "x"),                        # ambiguous (output, open-mode, ...): sbatch refuses it itself
    ("--par", "high"),                   # ambiguous too (partition, parsable)
    ("--", "--nodes=3"),                 # after --, not an option
])
def test_the_rest_passes_unchanged(args):
    assert planned_option(args) is None


def test_options_are_named_as_sbatch_names_them():
    assert [n for n, _ in sbatch_options(["--part=a", "-HJx", "--comm", "y", "-q", "z"])] == \
        ["partition", "hold", "job-name", "comment", "qos"]


def test_the_job_submit_plugin_knows_the_same_options():
    """plugins/job_submit.lua reads #SBATCH lines with its own copy of the option table (Lua
    cannot import Python): both copies are the same."""
    lua = (ROOT / "plugins" / "pswift_job_submit.lua").read_text()

    def table(name: str) -> list[str]:
        body = re.search(rf"local {name} = {{(.*?)}}", lua, re.S).group(1)
        return re.findall(r'"([a-z-]+)"', body)

    assert table("TAKES_VALUE") == SBATCH_TAKES_VALUE and table("FLAGS") == SBATCH_FLAGS
    short = dict(re.findall(r'(\w) = "([a-z-]+)"', re.search(r"local SHORT_VALUE = {(.*?)}", lua, re.S).group(1)))
    assert short == SBATCH_SHORT


def test_the_job_submit_plugin_knows_pswifts_marker_and_header_size():
    """The plugin knows a pswift job by the template's marker line and reads HEADER_MAX bytes
    of its directives: the Lua constants are the renderer's, and a rendered script has both."""
    lua = (ROOT / "plugins" / "pswift_job_submit.lua").read_text()
    mark, mark_bytes = re.search(r'local MARK, MARK_BYTES = "([^"]*)", (\d+)', lua).groups()
    header_max = int(re.search(r"local MAX_HEADER = (\d+)\n", lua).group(1))
    assert (mark, header_max) == (sbatch.MARK, sbatch.HEADER_MAX)
    script = sbatch.render(options_for(cfg := load_config(EXAMPLE / "train.toml"), "/r", time_limits(cfg)), "/r", "/py")
    first, second = script.split("\n")[:2]
    assert len(first) < int(mark_bytes) and second.startswith(sbatch.MARK)


def test_a_header_the_plugin_would_not_read_is_refused_at_render():
    cfg = load_config(EXAMPLE / "train.toml")
    opts = options_for(cfg, "/r", time_limits(cfg))._replace(extra=tuple(f"--comment={'x' * 900}{i}" for i in range(20)))
    with pytest.raises(ConfigError, match=r"#SBATCH lines take \d+ bytes, but the site's job_submit.lua reads the first 16384"):
        sbatch.render(opts, "/r", "/py")
