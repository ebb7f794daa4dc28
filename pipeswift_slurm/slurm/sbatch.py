r"""Render the batch script: ``#SBATCH`` lines from typed fields, sorted and quoted for Slurm.

``#SBATCH`` lines are read by sbatch's own parser (``get_argument`` in src/sbatch/opt.c), not by
bash: whitespace splits arguments, ``'`` or ``"`` group them, an unquoted ``#`` starts a comment,
and a backslash escapes the next character *even inside single quotes* (so bash's quoting, which
relies on ``'...'`` being literal, lets a job name holding ``\'`` smuggle options). Each argument
that needs it is therefore written in double quotes with ``\`` and ``"`` backslash-escaped, which
that parser reads back exactly (tested through real sbatch). Control characters cannot be
represented and are refused. In the ``--output`` path ``%`` is a filename pattern: the run
directory's own ``%`` is doubled, and a backslash (which turns patterns off) is refused.
The script body (bash) quotes with ``shlex.quote``.
"""

from __future__ import annotations

# Imports inside functions: the templates and encoders, only when a script is rendered

import re
import shlex
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from pipeswift_slurm import __version__, runfiles
from pipeswift_slurm.errors import ConfigError

TEMPLATE = "job.sbatch.tmpl"
#: plugins/job_submit.lua knows a pswift job by this start of its script's second line (as the
#: template renders it), and reads at most HEADER_MAX bytes of a script for its directives:
#: the lines before the first command must fit (tests/test_sbatch_options.py keeps them equal)
MARK = "# Rendered by pipeswift-slurm "
HEADER_MAX = 16384


#: ``@name`` placeholders in the template (bash's own ``$`` stays as written)
_PLACEHOLDER = re.compile(r"@([a-z_]+)")


class Limits(NamedTuple):
    """The time limits a job asks for: ``--time``, ``--time-min`` (None: not set) and the USR2
    lead (None: no limit, no signal), with why in one line (pipeswift_slurm.planning.limits
    decides them; plan.json carries them)."""
    time_s: int | None
    time_min_s: int | None
    signal_lead_s: int | None
    why: str


class SbatchOptions(NamedTuple):
    """The sbatch options pipeswift sets; ``extra`` are passed through verbatim (quoted)."""

    job_name: str
    nodes: str
    #: tasks per node and CPUs per task of the srun step (one task per slot)
    ntasks_per_node: int
    cpus_per_task: int
    #: the job log's path (None: sbatch's default, where sbatch runs: a --dry-run script's)
    output: str | None
    partition: str | None = None
    time: str | None = None
    time_min: str | None = None
    account: str | None = None
    qos: str | None = None
    gpus_per_node: int = 0
    signal: str | None = None
    #: a run of members: the job array's indices (``0-N``: one task a member, each ``nodes``)
    array: str | None = None
    extra: tuple[str, ...] = ()

    def directives(self) -> list[str]:
        # With a node range, --ntasks-per-node would fix ntasks = min nodes x tasks and Slurm then
        # allocates only the minimum; --mincpus asks the same per-node CPUs and keeps "take as
        # many nodes as are free" (the srun step sets tasks and CPUs per task itself).
        ranged = "-" in self.nodes
        opts: dict[str, Any] = {
            "job-name": self.job_name, "nodes": self.nodes,
            "ntasks-per-node": None if ranged else self.ntasks_per_node,
            "cpus-per-task": None if ranged else self.cpus_per_task,
            "mincpus": self.ntasks_per_node * self.cpus_per_task if ranged else None,
            "output": self.output, "partition": self.partition,
            "time": self.time, "time-min": self.time_min, "account": self.account, "qos": self.qos, "signal": self.signal,
            "array": self.array,
            "gres": f"gpu:{self.gpus_per_node}" if self.gpus_per_node else None,
            "open-mode": "append",  # a requeued attempt appends to the same log
            "requeue": True,        # preemption in REQUEUE mode and self-requeue need it
            "no-kill": True,        # a failed node leaves the allocation; the ranks go on without it
        }
        lines = []
        for key in sorted(opts):
            value = opts[key]
            if value is None:
                continue
            arg = f"--{key}" if value is True else f"--{key}={value}"
            lines.append(f"#SBATCH {_quote(arg)}")
        lines += [f"#SBATCH {_quote(e)}" for e in self.extra]
        return lines


_PLAIN = re.compile(r"^[A-Za-z0-9_=:/.,@%+-]+$")


def _quote(arg: str) -> str:
    """One argument as sbatch's script parser reads it back exactly."""
    bad = next((c for c in arg if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        what = "a newline" if bad in "\r\n" else f"the control character {bad!r}"
        raise ConfigError(f"sbatch option {arg!r} contains {what}, which a #SBATCH line cannot "
                          f"hold; remove it")
    if _PLAIN.match(arg):
        return arg
    return '"' + arg.replace('\\', '\\\\').replace('"', '\\"') + '"'


#: the file whose presence says the run directory was made (written last)
CARRIED_LAST = runfiles.PLAN


def _carried_block(files: dict[str, bytes]) -> str:
    """Shell that makes the run directory from ``files`` at the job's first start (each file
    written beside its name, then renamed; plan.json last, so its presence means all are there),
    records the job (pipeswift_launch.adopt: JOB_ID and the registry) and sends the rest of the
    output to RUN_DIR/slurm-JOBID.out. Each file is a base64 heredoc: no quoting to get wrong."""
    import base64
    import textwrap
    order = sorted(files, key=lambda n: n == CARRIED_LAST)
    lines = ["# a --dry-run script carries its run directory: made at the job's first start",
             f'if [ ! -e "$RUN_DIR/{CARRIED_LAST}" ]; then',
             '  mkdir -p "$RUN_DIR" || exit 1']
    for name in order:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"carried file name {name!r}")
        blob = "\n".join(textwrap.wrap(base64.b64encode(files[name]).decode(), 76)) or ""
        lines += [f'  base64 -d >"$RUN_DIR/.{name}.$$" <<\'PSWIFT_EOF\' || exit 1', blob, "PSWIFT_EOF",
                  f'  mv -f "$RUN_DIR/.{name}.$$" "$RUN_DIR/{name}"']
    lines += ['  cp "$0" "$RUN_DIR/job.sbatch" 2>/dev/null || true', "fi",
              '"$PYTHON" -m pipeswift_launch.adopt "$RUN_DIR" "${SLURM_JOB_ID}" || exit 1',
              'exec >>"$RUN_DIR/slurm-${SLURM_JOB_ID}.out" 2>&1']
    return "\n".join(lines) + "\n"


#: a run of members, before each launch: a seat in the run's next epoch, the ranks' place in it as
#: exports (pipeswift_launch.members), or "done" once the run has trained every step
JOIN = """  epoch=$("$PYTHON" -m pipeswift_launch.members "$PSWIFT_PLAN") || { rc=$?; break; }
  if [ "$epoch" = done ]; then rc=0; break; fi
  eval "$epoch"
"""


def output_pattern(run_dir: str) -> str:
    """The job log's ``--output`` in the run directory: its ``%`` literal, ``%j`` the job id."""
    if "\\" in run_dir:
        raise ConfigError(f"run directory {run_dir!r} contains a backslash, which turns off "
                          f"Slurm's %j in the log name; choose a directory without one")
    return f"{run_dir.replace('%', '%%')}/slurm-%j.out"


def render(options: SbatchOptions, run_dir: str, python: str, carried: dict[str, bytes] | None = None) -> str:
    """The batch script. ``carried`` (a --dry-run script's): the run directory's files, which
    the script writes at the job's first start (none is written before), then appending its
    output to the run directory's log, as a submitted job's --output does."""
    # next to the templates package's __init__ (importlib.resources would cost the submit path
    # its zipfile and tempfile imports; the package is always installed as plain files)
    import pipeswift_templates
    text = (Path(pipeswift_templates.__file__).parent / TEMPLATE).read_text(encoding="utf-8")
    for v in (run_dir, python):
        _quote(v)
    values = dict(
        version=__version__,
        job_name_comment=shlex.quote(options.job_name),
        directives="\n".join(options.directives()),
        run_dir=shlex.quote(run_dir),
        python=shlex.quote(python),
        tasks_per_node=str(int(options.ntasks_per_node)),
        cpus_per_task=str(int(options.cpus_per_task)),
    )
    # a line of its own, gone whole from a script that carries nothing (golden scripts unchanged)
    text = text.replace("@carried\n", _carried_block(carried) if carried else "")
    text = text.replace("@join\n", JOIN if options.array else "")
    script = _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)   # KeyError: a template typo
    header = len(script.split("\nset -uo pipefail\n", 1)[0].encode())
    if header > HEADER_MAX:
        raise ConfigError(f"the batch script's #SBATCH lines take {header} bytes, but the site's "
                          f"job_submit.lua reads the first {HEADER_MAX}: shorten [job] sbatch_options "
                          f"or the job name")
    return script


#: sbatch's long options (Slurm 25.11.7's `sbatch --autocomplete=--`; 22.05's are a subset),
#: split into those that take a value ("--opt=V" or the next argument) and those that take none
#: (or only "--opt=V"). plugins/job_submit.lua holds the same table (a test keeps them equal).
SBATCH_TAKES_VALUE = (
    "account acctg-freq array autocomplete batch bb bbf begin chdir cluster cluster-constraint clusters "
    "comment constraint container container-id context core-spec cores-per-socket cpu-freq cpus-per-gpu "
    "cpus-per-task deadline delay-boot dependency distribution error exclude export export-file extra "
    "extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags "
    "hint input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu "
    "mem-per-gpu mincpus network nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu "
    "ntasks-per-node ntasks-per-socket ntasks-per-tres open-mode output partition prefer priority profile "
    "qos reservation resources segment signal sockets-per-node switches tasks-per-node thread-spec "
    "threads-per-core time time-min tmp tres-bind tres-per-task uid wait-all-nodes wckey wrap").split()
SBATCH_FLAGS = (
    "consolidate-segments contiguous exclusive external get-user-env help hold ignore-pbs nice no-kill "
    "no-requeue oom-kill-step overcommit oversubscribe parsable propagate quiet reboot requeue resv-ports "
    "spread-job spread-segments stepmgr test-only usage use-min-nodes verbose version wait").split()
#: short options that take a value, with their long names (the others take none)
SBATCH_SHORT = {"A": "account", "a": "array", "b": "begin", "D": "chdir", "M": "clusters", "C": "constraint",
                "S": "core-spec", "c": "cpus-per-task", "d": "dependency", "m": "distribution", "e": "error",
                "x": "exclude", "B": "extra-node-info", "G": "gpus", "i": "input", "J": "job-name",
                "L": "licenses", "F": "nodefile", "w": "nodelist", "N": "nodes", "n": "ntasks", "o": "output",
                "p": "partition", "q": "qos", "t": "time"}


def sbatch_options(args: Sequence[str]) -> list[tuple[str, str]]:
    """(long name, as given) of each option in ``args`` as sbatch's getopt_long reads them: an
    exact name or a unique prefix (``--part=high`` is --partition), a value in the next argument
    consumed by an option that takes one (``--comment --nodes=3`` is a comment), short options
    and their clusters (``-HN3``); an unknown or ambiguous option is left for sbatch to refuse."""
    names = SBATCH_TAKES_VALUE + SBATCH_FLAGS
    out, k = [], 0
    while k < len(args):
        a = args[k]
        if a == "--":
            break
        if a.startswith("--"):
            given = a[2:].split("=", 1)[0]
            found = [given] if given in names else [n for n in names if n.startswith(given)] if given else []
            if len(found) == 1:
                out.append((found[0], a))
                if "=" not in a and found[0] in SBATCH_TAKES_VALUE:
                    k += 1
        elif a.startswith("-") and len(a) > 1:
            for j, c in enumerate(a[1:], start=1):
                if c in SBATCH_SHORT:
                    out.append((SBATCH_SHORT[c], a))
                    k += j == len(a) - 1   # "-N 3": the value is the next argument
                    break
                out.append(({"H": "hold", "Q": "quiet", "W": "wait", "O": "overcommit", "s": "oversubscribe",
                             "h": "help", "v": "verbose", "V": "version", "k": "no-kill"}.get(c, c), a))
        k += 1
    return out


#: sbatch options whose value pswift plans (or takes from train.toml): given after `--` they
#: would contradict the plan the job starts with, so they are refused, naming the TOML key
PLANNED = {"nodes": "[resources] nodes", "ntasks": "[resources] nodes and tasks_per_node",
           "ntasks-per-node": "[resources] tasks_per_node", "tasks-per-node": "[resources] tasks_per_node",
           "cpus-per-task": "[resources] cpus_per_task", "partition": "[job] partition", "time": "[job] time",
           "gres": "[resources] gpus_per_node", "gpus-per-node": "[resources] gpus_per_node"}
#: sbatch options that would break what pswift does for the job, each with why and what instead
BREAKS = {
    "no-requeue": "a preempted or timed-out pswift job is requeued to resume from its checkpoint "
                  "([job] max_requeues bounds how often)",
    "signal": "pswift asks for USR2 before the time limit itself, from [job] time",
    "open-mode": "every attempt appends to one log, which status, doctor and requeues read",
    "output": "the job's log is the run directory's slurm-%j.out, which status, doctor and requeues read "
              "(choose the directory with --run-dir)",
    "error": "the job's log is the run directory's slurm-%j.out, which status, doctor and requeues read "
             "(choose the directory with --run-dir)",
    "wrap": "pswift writes the batch script itself",
    "array": "the tasks of an array would share one run directory; submit one pswift job each",
}


def planned_option(args: Sequence[str]) -> str | None:
    """Why the sbatch arguments given after `--` cannot go with the plan, or None; the
    arguments are read as sbatch reads them (:func:`sbatch_options`)."""
    for name, given in sbatch_options(args):
        if name in PLANNED:
            before = f"give --{name} before the TOML (`pswift sbatch --{name}=... train.toml`) or " \
                if name in ("nodes", "partition", "time") else ""
            return (f"sbatch option {given!r} after `--` would override the planned --{name}: {before}set "
                    f"{PLANNED[name]} in train.toml instead (pswift plans the layout for it)")
        if name in BREAKS:
            return f"sbatch option {given!r} (--{name}) cannot go with a pswift job: {BREAKS[name]}"
    return None
