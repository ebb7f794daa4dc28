"""plugins/job_submit.lua's reading of a batch script, run by real Lua 5.1 and 5.3 interpreters (the
language slurmctld's job_submit/lua embeds) through tests/lua/job_submit_harness.lua: options
matched as sbatch's getopt_long matches them (unique prefixes, values in the next argument,
short options), quoting as sbatch's get_argument(), and the caps that bound its work. The same
file inside a real slurmctld is tested in test_admin.py (marked slurm)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import job_submit as job_submit_bench  # noqa: E402  (the grammar of script shapes)
PLUGIN = ROOT / "plugins" / "job_submit.lua"
HARNESS = ROOT / "tests" / "lua" / "job_submit_harness.lua"
#: the Lua slurmctld embeds: Debian's Slurm 22.05 links Lua 5.1, a source build of 25.11 Lua 5.3
LUAS = ("lua5.1", "lua5.3")


@pytest.fixture(params=LUAS)
def lua(request) -> str:
    path = shutil.which(request.param)
    if path is None:
        pytest.fail(f"no {request.param} interpreter: apt-get install {request.param} (make tools installs it)",
                    pytrace=False)
    return path
MARK = "#!/bin/bash\n# Rendered by pipeswift-slurm TEST for job x; edit train.toml\n"
PSWIFT_LIKE = MARK + "{extra}\nsrun python -m pipeswift_launch plan.json\n"
USR1 = "SIGUSR1 conflicts with NCCL"
TRUNCATE = "would erase the log of earlier attempts"


def submit(tmp_path: Path, script: str, lua: str, requeue: int | None = None, name: str = "job",
           work_dir: str = "/home/u") -> tuple[int, list[str]]:
    f = tmp_path / "job.sh"
    f.write_bytes(script.encode())
    args = [lua, str(HARNESS), str(PLUGIN), str(f), "1", "" if requeue is None else str(requeue), name, work_dir]
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
    ("#SBATCH --open-mode=t", TRUNCATE),               # Slurm reads the first letter only
    ("#SBATCH --open-mode=Trunc", TRUNCATE),
    ("#SBATCH --signal=010@60", USR1),                  # strtol: leading zeros, a sign, blanks
    ("#SBATCH --signal=+10@60", USR1),
    ('#SBATCH "--signal= 10@60"', USR1),
    ("#SBATCH --signal=65546@60", USR1),                # cast to 16 bits: 65536 + 10
    ("#SBATCH --signal=-65526", USR1),
    ("#SBATCH --signal=rb:Usr1", USR1),                 # R, B in any case, SIG optional
    ("#SBATCH --signal=BR:sigusr1@5", USR1),
    ("#SBATCH --comment='a b' --open-mode=truncate", TRUNCATE),
])
def test_options_are_matched_as_getopt_long_matches_them(tmp_path, extra, needle, lua):
    rc, messages = submit(tmp_path, PSWIFT_LIKE.format(extra=extra), lua)
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
    "#SBATCH --signal=100@60",                 # not 10
    "#SBATCH --signal=10x@60",                 # not a number to strtol's reader: sbatch refuses it
    "#SBATCH --signal=USR12@60",
    "#SBATCH --open-mode=append",
    "#SBATCH --open-mode=A",
    "  #SBATCH --open-mode=truncate",          # indented: a comment to sbatch
])
def test_what_sbatch_does_not_read_as_those_options_passes(tmp_path, extra, lua):
    rc, messages = submit(tmp_path, PSWIFT_LIKE.format(extra=extra), lua)
    assert rc == 0 and "user:" not in " ".join(messages), messages


def test_requeue_is_added_to_pswift_jobs_only_and_no_requeue_refused(tmp_path, lua):
    assert submit(tmp_path, PSWIFT_LIKE.format(extra=""), lua)[0] == 0
    rc, messages = submit(tmp_path, PSWIFT_LIKE.format(extra=""), lua, requeue=0)
    assert rc == -1 and "asks --no-requeue" in messages[0]
    rc, messages = submit(tmp_path, "#!/bin/bash\n#SBATCH --open-mode=truncate\ntrue\n", lua, requeue=0)
    assert rc == 0 and messages == []


@pytest.mark.parametrize("script", [
    "#!/bin/bash\n# a note: python -m pipeswift_launch plan.json\n#SBATCH --open-mode=truncate\ntrue\n",
    "#!/bin/bash\n#SBATCH --open-mode=truncate\nsrun python -m pipeswift_launch plan.json\n",
    "#!/bin/bash\n\n# Rendered by pipeswift-slurm 1 for job x\n#SBATCH --open-mode=truncate\ntrue\n",
    "#!/bin/" + "x" * 1100 + "\n# Rendered by pipeswift-slurm 1 for job x\n#SBATCH --open-mode=truncate\ntrue\n",
    "# Rendered by pipeswift-slurm 1 for job x\n#SBATCH --open-mode=truncate\ntrue\n",
])
def test_only_a_script_pswift_rendered_is_a_pswift_job(tmp_path, script, lua):
    """Mentioning pipeswift_launch, in a comment or a command, does not make a job pswift's, nor
    does pswift's marker anywhere but on the second line: such jobs pass untouched."""
    rc, messages = submit(tmp_path, script, lua, requeue=0)
    assert rc == 0 and messages == [], messages


@pytest.mark.parametrize("extra", [
    "#SBATCH " + "a " * 5000 + "\n#SBATCH --open-mode=truncate",
    "#SBATCH " + "\\\\" * 3000 + "\n#SBATCH " + "\\\\" * 3000 + "\n#SBATCH '--open-mode=truncate'",
])
def test_every_directive_within_the_header_is_checked(tmp_path, extra, lua):
    """No cap on arguments or quoted lines leaves a directive unchecked: the header's 16 KiB
    bound all the work, so everything inside it is read."""
    rc, messages = submit(tmp_path, PSWIFT_LIKE.format(extra=extra), lua)
    assert rc == -1 and TRUNCATE in messages[0], messages


@pytest.mark.parametrize("extra", [
    "#SBATCH --comment=" + "x" * 1_000_000,
    "\n" * 20_000 + "#SBATCH --open-mode=append",
    "# note\n" * 3000,
    "#SBATCH --comment=" + "x" * 16_400 + "\n#SBATCH --open-mode=append",
])
def test_a_header_longer_than_the_plugin_reads_is_refused(tmp_path, extra, lua):
    """Nothing past the script's first 16 KiB is read: a pswift job whose lines before its first
    command go further is refused with the fix (pswift renders a few KiB; its renderer refuses to
    write more, tests/test_sbatch_options.py)."""
    rc, messages = submit(tmp_path, PSWIFT_LIKE.format(extra=extra), lua)
    assert rc == -1 and "run past 16384 bytes" in messages[0] and "pswift sbatch" in messages[0], messages
    assert submit(tmp_path, PSWIFT_LIKE.format(extra="#SBATCH --comment=" + "x" * 16_000), lua)[0] == 0


# ----------------------------------------------------------------------------- linear by construction
@pytest.mark.parametrize("shape", list(job_submit_bench.SHAPES))
@pytest.mark.parametrize("marked", [True, False], ids=["pswift", "other"])
def test_the_plugins_time_per_byte_is_flat_for_every_shape(tmp_path, shape, marked, lua):
    """Each shape of bench/job_submit.py's grammar at n = 512 KiB and 8n = 4 MiB (Slurm's default
    max_script_size) through real Lua 5.1 and 5.3: time(8n) <= 12 time(n), and at most 5 ms a MiB at
    4 MiB (the plugin reads a bounded head of any script, so its time does not grow with the size
    at all); a pswift job whose directives run past what is read is refused, one whose body is
    large is accepted with --requeue, and another job passes untouched."""
    n = 512 * 1024
    times, verdicts = [], []
    for size in (n, 8 * n):
        f = tmp_path / "shape.sh"
        f.write_bytes(job_submit_bench.script(shape, size, marked).encode())
        t, rc, messages = job_submit_bench.per_call(PLUGIN, f, 20, lua)
        times.append(t)
        verdicts.append((rc, messages))
    assert times[1] <= 0.005 * 8 * n / (1 << 20), f"{shape} at 4 MiB: {times[1] * 1e3:.2f} ms a call"
    assert times[1] <= 12 * times[0] + 20e-6, f"{shape}: {times[0] * 1e6:.0f} us at {n} B, {times[1] * 1e6:.0f} us at 8x"
    where = job_submit_bench.SHAPES[shape][0]
    for rc, messages in verdicts:
        if not marked:
            assert (rc, messages) == (0, []), messages
        elif where == "body":
            assert rc == 0 and "added --requeue" in messages[-1], messages
        else:
            assert rc == -1 and "run past 16384 bytes" in messages[0], messages


@pytest.mark.parametrize("name,work_dir,refused", [
    ("x\ny DerivedExitCode=0:0 ExitCode=0:0 \nJobId=999 UserId=root(0) GroupId=root(0) Name=forged", "/h", "name"),
    ("a\x1b]0;OWNED\x07", "/h", "name"),             # a terminal escape
    ("a\u009b2J", "/h", "name"),                       # C1 (CSI) as UTF-8
    ("a\x7f", "/h", "name"),
    ("train", "/home/m\n77|alice|RUNNING|/home/m/fake", "work directory"),
    ("train-é-日本", "/home/ü/run 1", None),            # other text passes
])
def test_a_name_or_work_dir_with_a_control_character_is_refused_for_every_job(tmp_path, lua, name, work_dir,
                                                                                refused):
    """Slurm writes a job's name and work directory unescaped into jobcomp/filetxt and its
    listings: a newline there can forge a record (issue 57), an escape reach a terminal. The
    plugin refuses them for every job, pswift's or not; other names pass."""
    for script in ("#!/bin/bash\ntrue\n", PSWIFT_LIKE.format(extra="")):
        rc, msgs = submit(tmp_path, script, lua, name=name, work_dir=work_dir)
        if refused is None:
            assert rc == 0, msgs
        else:
            assert rc != 0 and any(f"job's {refused} holds a newline" in m for m in msgs), msgs
