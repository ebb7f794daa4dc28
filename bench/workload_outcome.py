"""What one policy's runs of bench/workload.py did, from what squeue showed and each training
job's events: JCT and bounded slowdown, the others' wait, makespan and utilisation, steps lost
or trained twice, goodput (:func:`summarise`). No Slurm and no torch here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import jctstats  # noqa: E402
from pipeswift_slurm.slurm.records import expand_hostlist  # noqa: E402
from pipeswift_slurm.stats import median  # noqa: E402


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _waits_and_runs(jobs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(wait, run) of each job seen both starting and ending (bounded slowdown's input)."""
    return [(j["start"] - j["submit"], j["end"] - j["start"]) for j in jobs if j.get("start") and j.get("end")]


def events_of(j: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A training job's events (its run directory's events.jsonl, read once per job by
    :func:`summarise`); None when unreadable."""
    try:
        return [json.loads(x) for x in (Path(j["run"]) / "events.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return None


def _train_outcome(j: dict[str, Any], evs: list[dict[str, Any]] | None) -> tuple[bool, int, int]:
    """(completed with every step, attempts that ended at a time limit, steps trained more than
    once beyond those a restart from a checkpoint runs again) from the run's events ``evs``: a
    step logged twice by launches that overlap in time is two trainings of one run."""
    if evs is None:
        return False, 0, 0
    steps = [e["step"] for e in evs if e["event"] == "step"]
    ends = [e.get("reason") for e in evs if e["event"] == "end"]
    overlapped = sum(1 for a, b in zip(steps, steps[1:]) if b < a and not _relaunched_between(evs, a, b))
    return (j["state"] == "COMPLETED" and set(steps) == set(range(1, j["steps"] + 1)), ends.count("time_limit"),
            overlapped)


def _useful_node_s(evs: list[dict[str, Any]] | None) -> float:
    """A training job's node-seconds of steps that count, from its events: each step's time (its
    last run: one run again after a restart counts once) x the nodes of the launch that ran it."""
    nodes, last = 1, {}
    for e in evs or []:
        if e["event"] == "start":
            nodes = int(e.get("nodes") or 1)
        elif e["event"] == "step":
            last[e["step"]] = float(e.get("step_time") or 0.0) * nodes
    return sum(last.values())


def goodput(train: list[dict[str, Any]], events: list[list[dict[str, Any]] | None]) -> float | None:
    """The training jobs' goodput: node-seconds of steps that count (``events``: each job's)
    over the node-seconds they held (squeue, one poll a second; a member waiting to join holds
    its node too). Set-up, checkpoints, steps run again, waits for an epoch and relaunches are
    the rest."""
    held = sum(nodes_in(nl) for j in train for _, nl in j.get("held") or [])
    return sum(_useful_node_s(evs) for evs in events) / held if held else None


def _relaunched_between(evs: list[dict[str, Any]], before: int, after: int) -> bool:
    """Whether a launch started from a step at or below ``after`` once step ``before`` was
    logged (a restart from a checkpoint: the steps since it are run again, in order)."""
    seen = False
    for e in evs:
        if e["event"] == "step" and e["step"] == before:
            seen = True
        elif seen and e["event"] == "start" and e["step"] < after:
            return True
    return False


def summarise(runs: list[dict[str, Any]], nodes: int) -> dict[str, Any]:
    """One policy's figures over its runs (a run per seed): JCT and bounded slowdown over every
    training job, the others' wait and bounded slowdown over every plain job, utilisation and
    makespan each run's, averaged, on a cluster of ``nodes`` nodes. ``lost``: training jobs not
    COMPLETED with every step; other users' jobs apart (``others_not_completed``: the dev
    cluster's JobRequeue=0 ends a plain job the high tenant preempts, as at many sites)."""
    jobs = [j for run in runs for j in run["jobs"]]
    train = [j for j in jobs if j["kind"] == "train"]
    plain = [j for j in jobs if j["kind"] == "plain"]
    jct = [j["end"] - j["submit"] for j in train if j["end"]]
    events = [events_of(j) for j in train]
    outcomes = [_train_outcome(j, evs) for j, evs in zip(train, events)]
    spans = [_span(run, nodes) for run in runs]
    started = [j for j in train if j.get("start")]

    def err(key: str) -> list[float]:
        return [abs(j[key] - j["start"]) for j in started if j.get(key) is not None]
    return {"train_jobs": len(train), "other_jobs": len(plain), **jctstats.jct_summary(jct),
            "bsld_mean": jctstats.mean_bsld(_waits_and_runs(train)),
            "others_wait_mean_s": _mean([j["start"] - j["submit"] for j in plain if j["start"]]),
            "others_bsld_mean": jctstats.mean_bsld(_waits_and_runs(plain)),
            "makespan_s": _mean([m for m, _ in spans if m is not None]),
            "utilisation": _mean([u for _, u in spans if u is not None]),
            "time_limit_requeues": sum(n for _, n, _ in outcomes),
            "steps_out_of_order": sum(n for _, _, n in outcomes),
            "train_requeues": sum(j.get("requeues") or 0 for j in train), "goodput": goodput(train, events),
            "others_cut": sum(1 for j in plain if j.get("cut")),
            "others_preempted": sum(1 for j in plain if j["state"] == "PREEMPTED"),
            "lost": sum(1 for ok, _, _ in outcomes if not ok),
            "others_not_completed": sum(1 for j in plain if j["state"] != "COMPLETED"),
            "start_error_median_s": {"pswift": _median(err("pswift_start")), "slurm": _median(err("slurm_start"))}}


def _span(run: dict[str, Any], nodes: int) -> tuple[float | None, float | None]:
    """(makespan, node utilisation) of one run: first arrival to last end, node-seconds held
    (one poll a second) over the cluster's."""
    ends = [j["end"] for j in run["jobs"] if j["end"]]
    if not ends:
        return None, None
    makespan = max(ends) - run["t0"]
    if any("held" not in j for j in run["jobs"]):   # a saved result keeps no polls: no utilisation
        return makespan, None
    node_s = sum(nodes_in(nl) for j in run["jobs"] for _, nl in j["held"] or [])
    node_s += sum(j["nodes"] * max(0.0, j["end"] - j["held"][-1][0])
                  for j in run["jobs"] if j.get("cut") and j["held"])
    return makespan, node_s / (nodes * makespan)


def _median(xs: list[float]) -> float | None:
    return median(xs)


def nodes_in(nodelist: str) -> int:
    return len(expand_hostlist(nodelist)) if nodelist else 0
