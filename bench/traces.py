"""Public cluster traces as a benchmark's workload (issue 58): any log in the Standard Workload
Format (SWF, the Parallel Workloads Archive's) and the Alibaba GPU cluster trace (v2023 CSV), read
into one record, and the mapping from a trace's jobs to the jobs a benchmark submits.

    python bench/traces.py ../shared/traces/nasa-ipsc-1993.swf.gz --nodes 64 --window 21600 --seed 1

prints the window's jobs as the benchmark would submit them (JSON lines) and a summary.

The mapping, as the docs state it:

- **Jobs with a complete run only.** SWF: every job with a run time and a size (-1 is unknown);
  Alibaba: tasks that ended (``Succeeded`` or ``Failed``: ``deletion_time - scheduled_time``);
  a task still ``Pending`` or ``Running`` at the trace's end has no run time.
- **A window.** ``window_s`` seconds of the trace from a seeded job's submission (``seed``), so
  each seed replays another stretch of the cluster's life; times (arrivals and run times) are
  divided by ``compression``.
- **Node scaling.** A job's size (SWF: allocated processors, else requested; Alibaba: GPUs) in
  nodes of the benchmark cluster: ``ceil(size * nodes / trace_size)`` where ``trace_size`` is
  the trace's machine (SWF ``MaxProcs``/``MaxNodes``, else its largest job; Alibaba: 8 GPUs, its
  largest node), at least 1 and at most the cluster.
- **Who trains.** A job of ``train_min_nodes`` nodes or more (default 2) becomes a pswift
  training job with the node range ``[ceil(n/2), min(2n, nodes)]`` around the ``n`` it asked;
  the others stay other users' plain jobs of their own size. On a cluster much smaller than the
  trace's (4 nodes for a 128-node log), where scaling leaves almost every job on one node,
  ``train_min_size`` decides instead: a job of that many of the trace's units (processors,
  GPUs) or more trains, with the range ``[1, 2]`` when it scaled to one node.
- **Limits.** The limit the log records (SWF field 9), scaled like the run time, when it is
  known and at least the run time; else drawn as users write them: the run time times a
  log-uniform factor in [1.2, 10] (users ask for more than they need, rarely less), rounded up
  to the next ``limit_round_s`` of trace time (users write round numbers).
- **Users and priorities.** SWF: the log's user ids as users ``u<id>``; its group 2
  (system personnel in the NASA log) or a queue named by ``high_queues`` is the high-priority
  tenant. Alibaba has no users: one tenant per QoS class; ``LS`` (latency-sensitive) preempts,
  ``BE``, ``Burstable`` and ``Guaranteed`` do not.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Iterable, Iterator

#: an SWF line's fields (1-based in the format's definition), the ones read here
SWF_JOB, SWF_SUBMIT, SWF_RUN, SWF_ALLOC, SWF_REQ_PROCS, SWF_REQ_TIME, SWF_USER, SWF_GROUP, SWF_QUEUE = \
    1, 2, 4, 5, 8, 9, 12, 13, 15
SWF_FIELDS = 18
ALIBABA_HIGH = ("LS",)
ALIBABA_GPUS_PER_MACHINE = 8


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace with a complete run, in the trace's own units (seconds, its size)."""
    job: str
    submit_s: float
    run_s: float
    size: int
    limit_s: float | None     # the limit the log records, None where it has none
    user: str
    high: bool                # the high-priority tenant's (preempts the others)


@dataclass(frozen=True)
class WorkloadJob:
    """A trace job as the benchmark submits it: its arrival from the window's start and run
    time in benchmark seconds, its node range (lo == hi for a plain job), its limit."""
    job: str
    arrival_s: float
    run_s: float
    nodes_lo: int
    nodes_hi: int
    nodes_asked: int
    limit_s: float
    user: str
    high: bool
    training: bool


class TraceError(ValueError):
    """A trace this module cannot read, with the line and what is wrong."""


def _open_text(path: Path) -> IO[str]:
    raw = path.open("rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.seek(0)
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8", errors="replace")
    raw.seek(0)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


def swf_header(lines: Iterable[str]) -> dict[str, str]:
    """The ``; Key: value`` lines of an SWF header (MaxProcs, MaxNodes, ...)."""
    out = {}
    for line in lines:
        if not line.startswith(";"):
            break
        key, sep, value = line[1:].partition(":")
        if sep and key.strip() and " " not in key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def read_swf(text: Iterable[str], high_queues: tuple[int, ...] = (), high_groups: tuple[int, ...] = (2,)
             ) -> Iterator[TraceJob]:
    """Every job of an SWF log with a run time and a size; a line that is not 18 numbers is a
    TraceError naming its line."""
    for n, line in enumerate(text, 1):
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        parts = line.split()
        if len(parts) != SWF_FIELDS:
            raise TraceError(f"SWF line {n}: {len(parts)} fields, not {SWF_FIELDS}")
        try:
            f = [float(p) for p in parts]
        except ValueError:
            raise TraceError(f"SWF line {n}: a field that is not a number") from None
        if not all(math.isfinite(v) for v in f):
            raise TraceError(f"SWF line {n}: a field that is not a finite number")
        run, size = f[SWF_RUN - 1], f[SWF_ALLOC - 1] if f[SWF_ALLOC - 1] > 0 else f[SWF_REQ_PROCS - 1]
        if run <= 0 or size <= 0 or f[SWF_SUBMIT - 1] < 0:
            continue
        limit = f[SWF_REQ_TIME - 1]
        yield TraceJob(job=str(int(f[SWF_JOB - 1])), submit_s=f[SWF_SUBMIT - 1], run_s=run, size=int(size),
                       limit_s=limit if limit > 0 else None, user=f"u{int(f[SWF_USER - 1])}",
                       high=int(f[SWF_QUEUE - 1]) in high_queues or int(f[SWF_GROUP - 1]) in high_groups)


def read_alibaba(text: Iterable[str]) -> Iterator[TraceJob]:
    """Every task of the Alibaba GPU trace that ended (Succeeded or Failed) after it was
    scheduled, sized in GPUs (at least 1: a CPU task takes a node's share too)."""
    rows = csv.DictReader(text)
    need = {"name", "num_gpu", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"}
    if rows.fieldnames is None or not need <= set(rows.fieldnames):
        raise TraceError(f"Alibaba CSV: the header lacks {sorted(need - set(rows.fieldnames or ()))}")
    for n, row in enumerate(rows, 2):
        if row["pod_phase"] not in ("Succeeded", "Failed"):
            continue
        try:
            created, scheduled, deleted = (float(row[k]) for k in ("creation_time", "scheduled_time", "deletion_time"))
            gpus = int(row["num_gpu"])
        except ValueError:
            raise TraceError(f"Alibaba CSV line {n}: a time or GPU count that is not a number") from None
        if deleted <= scheduled or created < 0:
            continue
        yield TraceJob(job=row["name"], submit_s=created, run_s=deleted - scheduled, size=max(1, gpus), limit_s=None,
                       user=f"qos-{row['qos']}", high=row["qos"] in ALIBABA_HIGH)


def read_trace(path: str | Path) -> tuple[list[TraceJob], int]:
    """A trace file's jobs, by submission, and its machine's size (SWF: MaxProcs or MaxNodes,
    else its largest job; Alibaba: one machine's GPUs)."""
    path = Path(path)
    with _open_text(path) as fh:
        head = fh.readline()
        rest = [head, *fh]
    if head.startswith("name,"):
        jobs, machine = list(read_alibaba(rest)), ALIBABA_GPUS_PER_MACHINE
    else:
        header = swf_header(rest)
        jobs = list(read_swf(rest))
        declared = [int(v) for k in ("MaxProcs", "MaxNodes") if (v := header.get(k, "")).isdigit() and int(v) > 0]
        machine = declared[0] if declared else max((j.size for j in jobs), default=1)
    if not jobs:
        raise TraceError(f"{path}: no job with a complete run")
    return sorted(jobs, key=lambda j: (j.submit_s, j.job)), machine


def draw_limit(run_s: float, rng: random.Random, round_s: float) -> float:
    """A limit as users write one: ``run_s`` times a log-uniform factor in [1.2, 10], rounded
    up to the next ``round_s``."""
    factor = math.exp(rng.uniform(math.log(1.2), math.log(10.0)))
    return math.ceil(run_s * factor / round_s) * round_s


def workload(jobs: list[TraceJob], machine: int, nodes: int, window_s: float, seed: int,
             compression: float = 1.0, train_min_nodes: int = 2, limit_round_s: float = 900.0,
             train_min_size: int | None = None) -> list[WorkloadJob]:
    """The benchmark's jobs from ``window_s`` seconds of ``jobs`` (sorted by submission) from a
    seeded job's submission, on ``nodes`` nodes (the module's docstring gives the mapping)."""
    if not jobs or nodes < 1 or window_s <= 0 or compression <= 0:
        raise ValueError("workload: give jobs, nodes >= 1, window_s > 0 and compression > 0")
    rng = random.Random(seed)
    first = rng.randrange(len(jobs))
    start = jobs[first].submit_s
    out = []
    for j in jobs[first:]:
        if j.submit_s >= start + window_s:
            break
        n = min(nodes, max(1, math.ceil(j.size * nodes / max(machine, 1))))
        training = n >= train_min_nodes if train_min_size is None else j.size >= train_min_size
        known = j.limit_s is not None and j.limit_s >= j.run_s
        limit = j.limit_s if known else draw_limit(j.run_s, rng, limit_round_s)
        assert limit is not None
        out.append(WorkloadJob(job=j.job, arrival_s=(j.submit_s - start) / compression, run_s=j.run_s / compression,
                               nodes_lo=max(1, math.ceil(n / 2)) if training else n,
                               nodes_hi=min(2 * n, nodes) if training else n, nodes_asked=n,
                               limit_s=limit / compression, user=j.user, high=j.high, training=training))
    return out


def contended(jobs: list[WorkloadJob], nodes: int) -> int:
    """How many of the high tenant's arrivals find the cluster full with a training job on it,
    were every other job to run from its arrival for its run time (no queue): the arrivals
    that would preempt a training job. A window is drawn for the preemptions it holds by this
    count alone (``bench/workload.py --contended K``), never by how a policy fares on it."""
    low = [j for j in jobs if not j.high]
    count = 0
    for h in (j for j in jobs if j.high):
        running = [j for j in low if j.arrival_s <= h.arrival_s < j.arrival_s + j.run_s]
        if any(j.training for j in running) and sum(j.nodes_asked for j in running) + h.nodes_asked > nodes:
            count += 1
    return count


def summary(jobs: list[WorkloadJob], nodes: int) -> dict[str, float]:
    """What a window holds: its jobs, training jobs, the high tenant's, and the node-seconds it
    asks against the cluster's over the window's span (its offered load)."""
    span = max((j.arrival_s for j in jobs), default=0.0) or 1.0
    demand = sum(j.run_s * j.nodes_asked for j in jobs)
    return {"jobs": len(jobs), "training": sum(j.training for j in jobs), "high": sum(j.high for j in jobs),
            "users": len({j.user for j in jobs}), "offered_load": demand / (nodes * span),
            "contended": contended(jobs, nodes)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--window", type=float, default=6 * 3600.0, help="seconds of the trace")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--compression", type=float, default=1.0, help="trace seconds per benchmark second")
    ap.add_argument("--train-min-size", type=int, default=None,
                    help="a job this large in the trace's units trains (default: one of 2 nodes or more here)")
    args = ap.parse_args(argv)
    try:
        jobs, machine = read_trace(args.trace)
        chosen = workload(jobs, machine, args.nodes, args.window, args.seed, args.compression,
                          train_min_size=args.train_min_size)
    except (OSError, TraceError, ValueError) as e:
        ap.exit(2, f"error: {e}\n")
    for j in chosen:
        print(json.dumps(asdict(j)))
    print(json.dumps({"trace": str(args.trace), "machine": machine, **summary(chosen, args.nodes)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
