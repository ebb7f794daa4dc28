"""plugins/job_submit.lua's reading of a batch script, run by a real Lua 5.3 interpreter (the
language slurmctld's job_submit/lua embeds) through tests/lua/job_submit_harness.lua: options
matched as sbatch's getopt_long matches them (unique prefixes, values in the next argument,
short options), quoting as sbatch's get_argument(), and the caps that bound its work. The same
file inside a real slurmctld is tested in test_admin.py (marked slurm)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "plugins" / "job_submit.lua"
HARNESS = ROOT / "tests" / "lua" / "job_submit_harness.lua"
LUA = shutil.which("lua5.3")
PSWIFT_LIKE = "#!/bin/bash\n{extra}\n# runs: python -m pipeswift_launch plan.json\ntrue\n"
USR1 = "SIGUSR1 conflicts with NCCL"
TRUNCATE = "would erase the log of earlier attempts"


def submit(tmp_path: Path, script: str, requeue: int | None = None) -> tuple[int, list[str]]:
    if LUA is None:
        pytest.fail("no lua5.3 interpreter: apt-get install lua5.3 (make tools installs it)", pytrace=False)
    f = tmp_path / "job.sh"
    f.write_bytes(script.encode())
    args = [LUA, str(HARNESS), str(PLUGIN), str(f), "1"] + ([str(requeue)] if requeue is not None else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    rc = int(out[-1].split()[0].split("=")[1])
    return rc, out[:-1]


@pytest.mark.parametrize("extra,needle", [
    ("#SBATCH --signal=USR1@60", USR1),
    ("#SBATCH --sig=USR1@60", USR1),                   # a unique prefix is the option
    ("#SBATCH --si=R:usr1", USR1),
    ("#SBATCH --signal USR1@60", USR1),                 # the value in the next argument
    ("#SBATCH --signal\n#SBATCH 10@60", USR1),          # ... on the next line
    ('#SBATCH --si"gnal"=USR1@60', USR1),               # quotes join pieces of one argument
    ("#SBATCH --si\\gnal=USR1@60", USR1),               # a backslash escapes the next character
    ("#SBATCH -H --open-mode=truncate", TRUNCATE),
    ("#SBATCH --open=truncate", TRUNCATE),
    ("#SBATCH --op TRUNCATE", TRUNCATE),
    ("#SBATCH --comment='a b' --open-mode=truncate", TRUNCATE),
])
def test_options_are_matched_as_getopt_long_matches_them(tmp_path, extra, needle):
    rc, messages = submit(tmp_path, PSWIFT_LIKE.format(extra=extra))
    assert rc == -1 and any(needle in m for m in messages), messages


@pytest.mark.parametrize("extra", [
    "#SBATCH --comment --signal=USR1@60",      # --comment takes the next argument as its value
    "#SBATCH -J --open-mode=truncate",         # so does -J
    "#SBATCH -HJ --open-mode=truncate",        # a cluster of short options: H, then J's value
    "#SBATCH --o truncate",                    # ambiguous (output, open-mode, ...): sbatch refuses it
    "#SBATCH --comment=a#b --open-mode=truncate",   # an unquoted # ends the line
    "#SBATCH '--comment=#' --signal=USR2@60",
    '#SBATCH "" --open-mode=truncate',         # an empty argument ends the line, as in sbatch
    "#SBATCH --signal=USR2@60 # --signal=USR1@60",
    "echo hi\n#SBATCH --open-mode=truncate",   # after the first command: not a directive
    "#SBATCH --signal=SIGUSR2@90",
])
def test_what_sbatch_does_not_read_as_those_options_passes(tmp_path, extra):
    rc, messages = submit(tmp_path, PSWIFT_LIKE.format(extra=extra))
    assert rc == 0 and "user:" not in " ".join(messages), messages


def test_requeue_is_added_to_pswift_jobs_only_and_no_requeue_refused(tmp_path):
    assert submit(tmp_path, PSWIFT_LIKE.format(extra=""))[0] == 0
    rc, messages = submit(tmp_path, PSWIFT_LIKE.format(extra=""), requeue=0)
    assert rc == -1 and "asks --no-requeue" in messages[0]
    rc, messages = submit(tmp_path, "#!/bin/bash\n#SBATCH --open-mode=truncate\ntrue\n", requeue=0)
    assert rc == 0 and messages == []


@pytest.mark.parametrize("extra,note", [
    ("#SBATCH --comment=" + "x" * 1_000_000 + "\n#SBATCH --open-mode=truncate", None),
    ("#SBATCH --comment=" + "x" * 70_000 + " --open-mode=truncate", "skipped a #SBATCH line of 70039 bytes"),
    ("#SBATCH " + "a " * 5000 + "\n#SBATCH --open-mode=truncate", "over 4096 #SBATCH arguments"),
    ("#SBATCH " + "\\\\" * 9000 + "\n#SBATCH '--open-mode=truncate'", "quoted or escaped #SBATCH lines over 16384"),
])
def test_caps_bound_the_work_with_a_log_line(tmp_path, extra, note):
    """Past a cap the rest goes unchecked, said in slurmctld's log; below every cap the same
    directives are still refused (the first case: a 1 MB line skipped, the next line read)."""
    rc, messages = submit(tmp_path, PSWIFT_LIKE.format(extra=extra))
    if note is None:
        assert rc == -1 and TRUNCATE in " ".join(messages)
        assert any("skipped a #SBATCH line of 1000018 bytes" in m for m in messages), messages
    else:
        assert rc == 0 and any(note in m for m in messages), messages
