"""What the tests share besides fixtures (conftest.py holds those): the real CLI in a
subprocess, the example copied and edited, the dev cluster's defaults (scripts/dev-cluster.env,
read rather than repeated), squeue polling, a whole example plan and a run's events read through
pipeswift_slurm.events (the one reader of that contract)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
import datetime as dt
import pwd
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-gpt"
CLUSTER = ROOT / "scripts" / "slurm-dev-cluster"
#: the console script's own entry point (pipeswift_slurm.cli.entry: the early Slurm queries, the fast exit)
PSWIFT = [sys.executable, "-m", "pipeswift_slurm.cli.entry"]


def pswift(*args: str, env: dict | None = None, timeout: float = 600, cwd: str | None = None,
           check: bool = False) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, as a user would run it."""
    proc = subprocess.run([*PSWIFT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"pswift {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


#: a child's script runs inside this: a raise prints its traceback and exits 1, the end exits 0,
#: both through the launcher's exit_now (the group destroyed, no interpreter teardown)
DIST_CHILD = """\
import sys, traceback
from pipeswift_launch.hardexit import exit_now
try:
    exec(compile(sys.argv.pop(1), "<child>", "exec"), {"__name__": "__main__"})
except SystemExit as e:
    exit_now(e.code if isinstance(e.code, int) else 1)
except BaseException:
    traceback.print_exc()
    exit_now(1)
exit_now(0)
"""


def run_dist_child(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -c code args...`` for a child that builds a process group or a DeepSpeed engine:
    it ends as every rank of a job does (pipeswift_launch.hardexit), so gloo's threads cannot
    abort it after its answer is printed (issue 43)."""
    return subprocess.run([sys.executable, "-c", DIST_CHILD, code, *args], capture_output=True,
                          text=True, timeout=timeout)


#: [training] lines of every DeepSpeed setting the example can take at once on CPU
BF16 = '''precision = "bf16"
zero_stage = 1
activation_checkpoint_interval = 1
gradient_clipping = 1.0
lr_warmup_steps = 2
lr_decay = "cosine"
lr_min_ratio = 0.1
'''


def copy_example(dst: Path, replace: dict[str, str] | None = None) -> Path:
    """Copy the tiny-gpt example to ``dst``; rewrite ``key = ...`` lines (``section.key`` if ambiguous).
    The copy takes the fastest layout (``jct_slack = 0``) and [job] time as written
    (``time_policy = "as_written"``) unless ``replace`` says otherwise: the tests of node ranges,
    growth and preemption are about those, not about the cost-aware choice or predicted limits
    (their slowed data makes the prediction wrong on purpose), which tests/test_planner.py,
    tests/test_cost_choice.py and tests/test_limits.py test."""
    from pipeswift_slurm.starter import init
    init(dst, "tiny-gpt")     # what `pswift init` writes: the example as shipped
    toml = dst / "train.toml"
    text = toml.read_text()
    for key, value in {"jct_slack": "0", "time_policy": '"as_written"', **(replace or {})}.items():
        section, _, name = key.rpartition(".")
        start = text.index(f"[{section}]") if section else 0
        end = text.find("\n[", start + 1) if section else len(text)
        end = len(text) if end < 0 else end
        part, n = re.subn(rf"(?m)^{re.escape(name)}\s*=.*$", f"{name} = {value}", text[start:end])
        assert n == 1, f"key {key} not found once in the example"
        text = text[:start] + part + text[end:]
    toml.write_text(text)
    return toml


def dev_cluster_defaults() -> dict[str, str]:
    """scripts/dev-cluster.env's NAME=value lines: the dev clusters' folders and ports."""
    text = (ROOT / "scripts" / "dev-cluster.env").read_text()
    return dict(m.groups() for m in re.finditer(r"(?m)^([A-Z_0-9]+)=(\S*)$", text))


DEV = dev_cluster_defaults()


#: the cluster the tests run on: scripts/with-slurm's (PSWIFT_CLUSTER_DIR), else 22.05's default
CLUSTER_DIR = Path(os.environ.get("PSWIFT_CLUSTER_DIR") or DEV["PSWIFT_DEV_DIR"])
CLUSTER_DB = CLUSTER_DIR / "history.db"      # where the installed jobcomp plugin merges
CLUSTER_SPOOL = CLUSTER_DIR / "jobcomp-spool"


def squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True)
    return set(out.stdout.split())


def new_jobs_since(before: set[str]) -> set[str]:
    """Jobs in squeue now that were not in ``before`` (one taken with squeue_ids()). Jobs of
    earlier tests may leave the list in between (MinJobAge), so compare the new ones only."""
    return squeue_ids() - before


def wait_state(job_id: str, states: set[str], timeout: float = 180) -> str:
    deadline = time.time() + timeout
    state = ""
    while time.time() < deadline:
        state = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
                               capture_output=True, text=True).stdout.strip()
        if state in states:
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {state!r} after {timeout} s, wanted {states}")


@functools.lru_cache(maxsize=1)
def _example_plan() -> str:
    from pipeswift_slurm.config import load_config
    from pipeswift_slurm.planning.build import build_plan
    return json.dumps(build_plan(load_config(EXAMPLE / "train.toml"), Path("/nonexistent/run")))


def plan_with(training: dict | None = None, **top) -> dict:
    """A whole plan.json (the example's, as `pswift sbatch` writes it) with ``top`` keys replaced
    and ``training`` merged: what unit tests of the launcher's decisions start from, since the
    launcher reads plan data without defaults (plan.runnable checks it has every key)."""
    base = json.loads(_example_plan())
    return {**base, **top, "training": {**base["training"], **(training or {})}}


def run_events(run_dir: Path | str, torn_ok: bool = False) -> list[dict[str, Any]]:
    """The run's events as the schema reads them (pipeswift_slurm.events.read); every line must
    be valid unless ``torn_ok`` (a job still writing may have a torn last line)."""
    from pipeswift_slurm import events
    evs, skipped = events.read(run_dir)
    assert torn_ok or skipped == 0, f"{skipped} invalid line(s) in {run_dir}/events.jsonl"
    return evs


class FakeSlurm:
    """The launcher's port to Slurm (pipeswift_launch.slurmport.SlurmPort) with no Slurm: it
    answers what the test set and records, in ``calls``, what the launcher asked for."""

    def __init__(self, job: Any = None, preempted: bool = False, requeues_preempted: bool = False,
                 state: Any = None) -> None:
        self.job, self.preempted, self.requeues_preempted, self.state = job, preempted, requeues_preempted, state
        self.calls: list[tuple] = []

    def requeue(self, job_id: str, exclude: str | None = None, nodes_needed: int = 1) -> bool:
        self.calls.append(("requeue", job_id, exclude))
        return exclude is not None

    def set_node_range(self, job_id: str, node_range: str) -> None:
        self.calls.append(("set_node_range", job_id, node_range))

    def set_time_limit(self, job_id: str, limit_s: int, time_min_s: int | None = None) -> None:
        self.calls.append(("set_time_limit", job_id, limit_s))

    def forbid_requeue(self, job_id: str) -> None:
        self.calls.append(("forbid_requeue", job_id))

    def shrink_job(self, job_id: str, nodelist: str) -> None:
        self.calls.append(("shrink_job", job_id, nodelist))

    def being_preempted(self, job_id: str, attempt: int | None = None) -> bool:
        return self.preempted

    def requeues_preempted_jobs(self) -> bool:
        return self.requeues_preempted

    def cluster_state(self, now: float | None = None) -> Any:
        return self.state

    def job_info(self, job_id: str) -> Any:
        return self.job(job_id) if callable(self.job) else self.job

    def cancel_pending(self, array_job_id: str) -> None:
        self.calls.append(("cancel_pending", array_job_id))

    def set_array_throttle(self, array_job_id: str, at_once: int) -> None:
        self.calls.append(("set_array_throttle", array_job_id, at_once))


@contextlib.contextmanager
def slurm_port(fake: FakeSlurm) -> Iterator[FakeSlurm]:
    """``fake`` in the Slurm client's place for the launcher, while the block runs."""
    from pipeswift_launch import slurmport
    old = slurmport.use(fake)
    try:
        yield fake
    finally:
        slurmport.use(old)


def step_losses(run: Path, torn_ok: bool = False) -> dict[int, str]:
    """Each step's loss (its exact bits, hex) in the run's events; a step run again after a
    restart or a requeue has its last value."""
    return {e["step"]: e["loss_hex"] for e in run_events(run, torn_ok) if e["event"] == "step"}


# ----------------------------------------------------------------------------- jobs through the dev cluster
SLOW_DATA = '''
import time
from model import batch as _batch


def batch(**kw):
    time.sleep(float(__import__("os").environ.get("PSWIFT_TEST_SLEEP", "{sleep_s}")))
    return _batch(**kw)
'''


def slow_example(dst: Path, replace: dict[str, str], sleep_s: float = 0.06) -> Path:
    """The example with ~0.25 s steps (the data function sleeps ``sleep_s`` a micro-batch), so
    signals land mid-run."""
    toml = copy_example(dst, replace)
    (toml.parent / "slow.py").write_text(SLOW_DATA.replace("{sleep_s}", str(sleep_s)))
    toml.write_text(toml.read_text().replace('data = "model:batch"', 'data = "slow:batch"'))
    return toml


def wait_steps(run: Path, n: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if sum(e["event"] == "step" for e in run_events(run, torn_ok=True)) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} steps after {timeout} s: {run_events(run, torn_ok=True)[-3:]}")


def reference(toml: Path, tmp_path: Path, nodes: int) -> Path:
    """The uninterrupted run of ``toml`` on ``nodes`` local slots. The slow example's data sleep
    is left out (it paces signals, not the numbers): a 100-step reference takes 18 s, not 42."""
    return Reference(toml, tmp_path, nodes).wait()


class Reference:
    """`reference` started now, in the background: a test whose Slurm job mostly sleeps (the
    slow example) computes the reference while it waits, rather than after it (the same run;
    its rendezvous port is the kernel's choice, so it never meets the job's). The
    ``background_reference`` fixture kills one a failed test leaves running."""

    def __init__(self, toml: Path, tmp_path: Path, nodes: int):
        self.run = tmp_path / "reference"
        self.proc = subprocess.Popen([*PSWIFT, "run", "--nodes", str(nodes), "--run-dir", str(self.run), str(toml)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PSWIFT_TEST_SLEEP": "0"})

    def wait(self, timeout: float = 600) -> Path:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, out[-4000:]
        return self.run

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def slurm_log(run: Path) -> str:
    return "".join(p.read_text() for p in run.glob("slurm-*.out"))


def preempted_once(toml: Path, run: Path, after_steps: int, preemptor: list[str] | tuple[str, ...] = ("-p", "high"),
                   timeout: float = 300, followed: list | None = None, waited: list | None = None) -> dict:
    """Submit ``toml``; once ``after_steps`` steps ran, a 2-node exclusive job with ``preemptor``'s
    options preempts it; wait until it completed; its `pswift status --json`. With a
    ``followed`` list, `pswift logs JOB -f` runs from the submit on and its (exit, stdout,
    stderr) is appended to the list; with a ``waited`` list, the job is submitted with
    `pswift sbatch --wait` and that command's (exit, stdout, stderr) is appended."""
    if waited is None:
        proc = pswift("sbatch", "--parsable", "--run-dir", str(run), str(toml))
        assert proc.returncode == 0, proc.stderr
        job = proc.stdout.strip()
    else:
        submitter = subprocess.Popen([*PSWIFT, "sbatch", "--wait", "--run-dir", str(run), str(toml)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = submitter.stdout.readline() if submitter.stdout else ""
        assert first.startswith("Submitted pswift job "), first + submitter.communicate(timeout=60)[1]
        job = first.split()[3]
    follower = None if followed is None else subprocess.Popen(
        [sys.executable, "-m", "pipeswift_slurm.cli.main", "logs", job, "-f"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_steps(run, after_steps, timeout=timeout)
        high = subprocess.run(["sbatch", "--parsable", *preemptor, "-N2", "--exclusive", "-o", "/dev/null",
                               "--wrap", "sleep 300"], capture_output=True, text=True, check=True).stdout.strip()
        try:
            assert wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=timeout) == "COMPLETED", slurm_log(run)
        finally:
            subprocess.run(["scancel", high])
        if follower is not None and followed is not None:
            out, err = follower.communicate(timeout=60)
            followed.append((follower.returncode, out, err))
        if waited is not None:
            out, err = submitter.communicate(timeout=120)
            waited.append((submitter.returncode, first + out, err))
    finally:
        if follower is not None:
            follower.kill()
        if waited is not None:
            submitter.kill()
    return json.loads(pswift("status", job, "--json", check=True).stdout)


def all_idle(timeout: float = 60) -> None:
    """Until every node of the cluster SLURM_CONF names is idle (a job's end leaves its nodes
    completing for a moment)."""
    deadline = time.time() + timeout
    while True:
        states = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True).stdout.split()
        if states and all(st == "idle" for st in states):
            return
        assert time.time() < deadline, f"nodes not idle after {timeout} s: {states}"
        time.sleep(0.5)


def rank_process(run: Path, rank: int) -> tuple[int, str]:
    """(pid, node) of the launcher process of ``rank`` in this run (a Slurm job's, or pswift run's)."""
    plan = str(run / "plan.json")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if b"pipeswift_launch" not in cmd or plan.encode() not in cmd:
                continue
            env = dict(x.split(b"=", 1) for x in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in x)
        except OSError:
            continue
        if (env.get(b"SLURM_PROCID") or env.get(b"RANK")) == str(rank).encode():
            return int(pid), env.get(b"SLURMD_NODENAME", b"localhost").decode()
    raise AssertionError(f"no launcher process of rank {rank} for {run}")




# ----------------------------------------------------------------------------- small fixtures' data
#: the unprivileged user tests create (conftest's other_user) to hand run directories to
USER = "pswift-test"
PLAN = {"version": 1, "job_name": "victim", "user": "alice", "partition": "low", "submitted_at": 1.0,
        "model": {"entry": "model:layers", "kwargs": {}, "num_layers": 2}, "training": {"steps": 3}}
GOOD = [{"event": "start", "attempt": 0, "time": 10.0, "nodes": 1, "world_size": 1, "stages": 1,
         "data_parallel": 1, "micro_batches": 2, "micro_batch_size": 1, "boundaries": [0, 2],
         "step": 0, "setup_s": 1.0},
        {"event": "step", "attempt": 0, "time": 11.0, "step": 1, "loss": 2.0, "step_time": 0.5},
        {"event": "step", "attempt": 0, "time": 12.0, "step": 2, "loss": 1.5, "step_time": 0.25},
        {"event": "layer_profile", "attempt": 0, "time": 12.0, "micro_batch_size": 1,
         "seconds": {"0": 0.1, "1": 400.0}},
        {"event": "end", "attempt": 0, "time": 13.0, "reason": "completed", "step": 2}]

def run_dir(path: Path, events: list[bytes] | None = None, owner: pwd.struct_passwd | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "plan.json").write_text(json.dumps(PLAN))
    (path / "JOB_ID").write_text("4242\n")
    lines = [json.dumps(e).encode() for e in GOOD] + (events or [])
    (path / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    if owner is not None:
        for p in (path, *path.iterdir()):
            os.chown(p, owner.pw_uid, owner.pw_gid)
    return path


def zero_partitions(sizes: list[int], pads: list[int], dp: int) -> tuple[dict, list]:
    """({name: (master, exp_avg)}, each data-parallel rank's parts) for one parameter group laid
    out as DeepSpeed's ZeRO-1 does: parameters flattened one after another (``pads`` elements of
    padding after each), the buffer padded to a multiple of ``dp`` and split into equal
    partitions; a rank lists a parameter's start, from its partition's first element, only when
    a piece of it is in its partition."""
    import torch
    params, chunks, starts, at = [], [], {}, 0
    whole = {}
    for i, (n, pad) in enumerate(zip(sizes, pads)):
        name = f"{i}.weight"
        master = torch.arange(n, dtype=torch.float32) + 1000 * i
        whole[name] = (master.view(n, 1), master.view(n, 1) * 2)
        params.append((name, torch.Size([n, 1]), n))
        starts[name] = at
        chunks += [master, torch.zeros(pad)]
        at += n + pad
    flat = torch.cat(chunks + [torch.zeros(-at % dp)])
    size = flat.numel() // dp
    parts = []
    for r in range(dp):
        lo, hi = r * size, (r + 1) * size
        mine = {name: s - lo for name, s in starts.items() if s < hi and s + dict((p[0], p[2]) for p in params)[name] > lo}
        part = flat[lo:hi].clone()
        parts.append([(params, {None: part, "exp_avg": part * 2}, {"step": torch.tensor(3.0)}, mine)])
    return whole, parts


def blob_of(tensors: dict) -> dict:
    """A stage file's content around ``tensors``: optimizer state, groups, scheduler, RNG."""
    import torch
    return {"model": tensors, "optim": {n: {"exp_avg": t.float() * 2, "step": 3} for n, t in tensors.items()},
            "param_groups": [{"lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.0}],
            "lr_scheduler": {"last_batch_iteration": 7}, "rng": torch.get_rng_state(), "stage": 1}


#: a jobcomp record of a plain (not pswift) job, as slurmctld gives the plugin its fields
JOBCOMP_ENV = {"JOBID": "777", "JOBNAME": "plain job", "JOBSTATE": "COMPLETED", "PARTITION": "low",
       "NODECNT": "1", "NODES": "node1", "SUBMIT": "1700000000", "START": "1700000060",
       "END": "1700000660", "USERNAME": "alice", "UID": "1000", "EXITCODE": "0", "PROCS": "1"}


#: the admin reports' clock: a Monday, 22:00 local time
T0 = dt.datetime(2026, 11, 2, 22, 0).timestamp()
H = 3600.0


def rec(jid: str, start: float, end: float | None, **kw: object) -> dict:
    base = {"JOBID": jid, "JOBNAME": f"j{jid}", "USERNAME": "alice", "ACCOUNT": "physics", "QOS": "normal",
            "PARTITION": "low", "JOBSTATE": "COMPLETED", "NODECNT": "1", "PROCS": "4", "SUBMIT": start - 600,
            "START": start, "END": end, "EXITCODE": "0:0", "LIMIT": "02:00:00", "CLUSTER": "c"}
    return {**base, **{k.upper(): v for k, v in kw.items()}}


def tensorboard_scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` in the run's TensorBoard files, read with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run / "tensorboard" / ("events" if tag.startswith("events/") else "train")))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def wandb_history(run: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` in every offline W&B run under the run directory, oldest first,
    read with wandb's own reader of its transaction log (``wandb leet inspect --json``)."""
    import glob
    wandb_cli = Path(sys.executable).with_name("wandb")
    points = []
    for offline in sorted(glob.glob(str(run / "wandb" / "offline-run-*"))):
        out = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", offline], capture_output=True,
                             text=True, timeout=120, check=True).stdout
        for line in out.splitlines():
            rec = json.loads(line)
            item = rec.get("history", {}).get("item", {}) if rec.get("type") == "history" else {}
            if tag in item:
                points.append((int(item["_step"]), float(item[tag])))
    return points


def bring_back(node: str) -> None:
    """The node's slurmd started again and the node resumed, for the tests that follow."""
    pidfile = CLUSTER_DIR / "run" / f"slurmd-{node}.pid"
    try:
        alive = pidfile.exists() and os.kill(int(pidfile.read_text()), 0) is None
    except (OSError, ValueError):
        alive = False
    if not alive:
        subprocess.run(["slurmd", "-f", os.environ["SLURM_CONF"], "-N", node], check=True, timeout=60)
    deadline = time.time() + 90
    while time.time() < deadline:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True, timeout=30)
        state = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%t"], capture_output=True, text=True,
                               timeout=30).stdout.strip()
        if state in ("idle", "alloc", "mix"):
            return
        time.sleep(1)
    raise AssertionError(f"{node} did not come back: {state}")


def paced_example(d: Path, steps: int, members: int = 2, nodes: str = "[1, 2]",
                  time_policy: str = "as_written") -> Path:
    """A run of one-node members whose 8 layers sleep 10 ms each (bench/workload.py's paced
    layers): a step takes 0.32 s on 1 stage and 0.20 s on 2, as on machines of their own. Its
    limit is 30 minutes as written (a predicted one, ``time_policy = "predicted"``, is the
    host's speed alone: three CI streams on two cores ran a member past it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from workload import PACED
    d.mkdir(parents=True)
    (d / "paced.py").write_text(PACED)
    (d / "train.toml").write_text(f"""[job]
name = "members"
partition = "low"
time = "30"
time_policy = "{time_policy}"
max_requeues = 6
grow_check_s = 5
sbatch_options = ["--exclusive"]

[resources]
nodes = {nodes}
members = {members}
member_wait_s = 120
tasks_per_node = 1

[model]
entry = "paced:build_layers"
loss = "paced:mse"
num_layers = 8
layer_costs = [{", ".join(["0.01"] * 8)}]
kwargs = {{ width = 16, costs = [{", ".join(["0.01"] * 8)}] }}

[training]
steps = {steps}
global_batch_size = 16
micro_batch_size = 4
data = "paced:batch"
seed = 1
optimizer = {{ type = "AdamW", params = {{ lr = 0.001 }} }}
checkpoint_interval = 0

[pipeline]
rebalance = false
""")
    return d / "train.toml"
