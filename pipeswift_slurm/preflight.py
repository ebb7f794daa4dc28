"""Before anything is queued: can the job's interpreter run the job at all?

A login-node install (``pip install pipeswift-slurm``, no torch) plans and queues happily, and
each rank then dies on a compute node with ``No module named 'torch'`` after the queue wait.
This asks the job's interpreter (``[job] python``, else this one) where it would find what the
launcher imports, with ``importlib.util.find_spec``: no module is imported (never torch on the
submit path). Another interpreter is asked in a child process (one start-up, while the
submission plans); this one, the default, in this process (no child: on a login node's few cores
a second interpreter start-up is a submission's largest cost after its own).
"""

from __future__ import annotations

# Imports inside functions: importlib.util, only when the job's interpreter is the running one

import os
import subprocess
import sys

#: what every rank imports: the launcher, the plan's reader, and the training stack
NEEDED = ("pipeswift_launch", "pipeswift_slurm", "torch", "deepspeed")
FIX = "install pipeswift-slurm's training side there (pip install 'pipeswift-slurm[train]'), " \
      "or set [job] python to an interpreter that has it"
_ASK = ("import importlib.util, sys\n"
        "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))\n")


class Check:
    """The question, asked at once in a child process (it runs while the submission plans), or
    for this very interpreter in this process; :meth:`missing` and :meth:`problem` wait for its
    answer."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.error: OSError | None = None
        self.proc: subprocess.Popen[str] | None = None
        # the same path (not the same binary: a venv's python links to the system's)
        self.in_process = os.path.abspath(python) == os.path.abspath(sys.executable)
        if self.in_process:
            return
        try:
            self.proc = subprocess.Popen([python, "-c", _ASK, *NEEDED], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        except OSError as e:
            self.error = e

    def missing(self, timeout: float = 30.0) -> list[str]:
        """The modules of NEEDED the interpreter cannot find (OSError when it cannot be run)."""
        if self.in_process:
            import importlib.util
            return [m for m in NEEDED if importlib.util.find_spec(m) is None]
        if self.proc is None:
            raise self.error or OSError("not started")
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise OSError(f"did not answer in {timeout:g} s") from None
        if self.proc.returncode != 0:
            raise OSError((err.strip().splitlines() or [f"exit {self.proc.returncode}"])[-1])
        return out.split()

    def problem(self) -> str | None:
        """One line saying why the interpreter cannot run a pswift job and what to change; None
        when it can."""
        try:
            gone = self.missing()
        except OSError as e:
            return (f"[job] python = {self.python}: cannot run it ({e.strerror or e}); set [job] python "
                    f"to a Python 3 interpreter")
        if not gone:
            return None
        return (f"the job's Python ({self.python}) cannot import {', '.join(gone)}, so every rank would "
                f"fail after the queue wait: {FIX}")


def missing(python: str) -> list[str]:
    return Check(python).missing()


def problem(python: str) -> str | None:
    return Check(python).problem()
