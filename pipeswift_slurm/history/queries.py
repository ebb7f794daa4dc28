"""Every read of the history database: what the planner, the reports and the doctor ask of it,
each a method of :class:`History` (this class is its base), with named columns, so no other
module holds SQL or indexes a row by position."""

from __future__ import annotations

import json
import sqlite3
import time as _time
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple

from pipeswift_slurm.history.schema import STOPPED
from pipeswift_slurm.stats import median_of

if TYPE_CHECKING:
    from pipeswift_slurm.history.selection import Selection


class LayerProfile(NamedTuple):
    """A model's per-layer profile as the planner reads it (one micro-batch size)."""
    micro_batch_size: int
    seconds: list[float]
    param_bytes: list[int]
    activation_bytes: list[int]
    saved_bytes: list[int | None]
    #: W's share of each layer's seconds, as a ZB-H1 run measured it (None: never measured)
    weight_fraction: list[float | None]


#: sacct's AllocTRES of the newest attempt ("cpu=4,mem=8000M,node=1,gres/gpu=2"), what is known of it
_ALLOC_TRES = ("NULLIF(trim(COALESCE('cpu=' || r.cpus, '') || COALESCE(',mem=' || CAST(r.mem_mb AS INTEGER) || 'M', '')"
               " || COALESCE(',node=' || r.nodes, '') || CASE WHEN r.gpus > 0 THEN ',gres/gpu=' || r.gpus ELSE '' END,"
               " ','), '')")

#: a roll-up row from Slurm's own records (the jobcomp plugin, sacct, filetxt), not the ones a
#: run's events stand in for until those come (rows.slurm_records): what the planner learns
#: from, as a user's run directory is their word (its plan.json's submit time, its partition)
SLURMS_OWN = ("NOT EXISTS (SELECT 1 FROM slurm_jobs d WHERE d.cluster = job_rollup.cluster AND "
              "d.job_id = job_rollup.job_id AND d.source = 'pswift')")

#: each job-listing column as SQL over job_rollup r (a plain job's figures; pswift jobs get
#: their setup/training/checkpoint split and steps lost from the pswift tables)
LISTING_SQL = {
    "job_id": "r.job_id", "name": "r.name", "user": "r.user", "account": "r.account",
    "partition": "r.partition", "qos": "r.qos", "state": "r.last_state", "exit_code": "r.exit_code",
    "derived_exit_code": "r.derived_exit_code", "pswift": "0", "nodes": "r.nodes", "cpus": "r.cpus",
    "gpus": "r.gpus", "alloc_tres": _ALLOC_TRES, "attempts": "r.attempts", "submit": "r.submit",
    "start": "r.start", "end": "r.end", "nodelist": "r.nodelist", "queue_s": "r.queue_s",
    "setup_s": "0.0", "training_s": "r.run_s", "checkpoint_s": "0.0", "jct_s": "r.jct_s",
    "elapsed_s": "r.run_s", "limit_s": "r.limit_s", "cpu_time_s": "r.cpu_time_s",
    "max_rss_mb": "r.max_rss_mb", "req_mem_mb": "r.req_mem_mb",
    "time_eff": "r.last_elapsed_s / NULLIF(r.limit_s, 0)", "cpu_eff": "r.cpu_time_s / NULLIF(r.cpu_s, 0)",
    "mem_eff": "r.max_rss_mb / NULLIF(r.req_mem_mb, 0)", "node_hours": "r.node_s / 3600.0",
    "cpu_hours": "r.cpu_s / 3600.0", "gpu_hours": "r.gpu_s / 3600.0", "preemptions": "r.preempted",
    "steps_lost": "NULL", "wasted_hours": "r.wasted_s / 3600.0", "step_mean_s": "NULL",
    "predicted_jct_s": "NULL",
}


def _nodes_on_a_host(ranks_per_host: int | None, nodes: int | None, ranks: int | None) -> int | None:
    """Nodes of one launch that shared a host: the ranks the probe found on its host over the
    launch's ranks per node (None: not measured)."""
    if not ranks_per_host or not nodes or not ranks:
        return None
    return max(1, min(nodes, round(ranks_per_host * nodes / ranks)))


class MeasuredHardware(NamedTuple):
    """Medians of what recent launches measured (None: none measured that one)."""

    p2p_latency_s: float | None
    p2p_bandwidth: float | None
    device_memory: float | None
    launches: int
    #: the host's cores (CPU), and how many of the partition's nodes were seen on one host
    #: (virtual nodes: a launch of n nodes whose ranks all shared one host counts n)
    host_cores: int | None = None
    nodes_per_host: int | None = None


#: the roll-up columns a report may group by
ROLLUP_KEYS = ("partition", "user", "account", "qos", "nodes")


class Queries:
    conn: sqlite3.Connection

    def _named(self, sql: str, params: Any = ()) -> Iterator[sqlite3.Row]:
        cur = self.conn.cursor()
        cur.row_factory = sqlite3.Row
        return cur.execute(sql, params)

    def clusters_of(self, job_id: str, among: tuple[str, ...] = ()) -> list[str]:
        """The clusters whose job ``job_id`` the history holds (Slurm's records or pswift's
        runs), of ``among`` when given: one history may serve several clusters. An unknown
        cluster ('': a run an older pswift recorded) is none of them."""
        rows = self.conn.execute(
            "SELECT cluster FROM job_rollup WHERE job_id = ? UNION SELECT cluster FROM jobs WHERE job_id = ?",
            [job_id, job_id])
        return sorted({r[0] for r in rows if r[0] and (not among or r[0] in among)})

    # ------------------------------------------------------------------------- the planner
    def layer_profile(self, mkey: str) -> LayerProfile | None:
        """The model's newest profile (saved bytes None where not measured; a layer's weight
        fraction is the newest measured at any micro-batch size, None where none was)."""
        rows = list(self.conn.execute(
            "SELECT micro_batch_size, layer, seconds, param_bytes, activation_bytes, saved_bytes, "
            "COALESCE(weight_fraction, (SELECT o.weight_fraction FROM layer_profiles o WHERE o.model_key = "
            "l.model_key AND o.layer = l.layer AND o.weight_fraction IS NOT NULL ORDER BY o.updated DESC "
            "LIMIT 1)) FROM layer_profiles l WHERE model_key = ? ORDER BY updated DESC, layer", [mkey]))
        if not rows:
            return None
        mbs = rows[0][0]
        mine = sorted((r for r in rows if r[0] == mbs), key=lambda r: r[1])
        return LayerProfile(mbs, [r[2] for r in mine], [int(r[3] or 0) for r in mine],
                            [int(r[4] or 0) for r in mine], [r[5] for r in mine], [r[6] for r in mine])

    def pipe_overheads(self, mkey: str, micro_batch_size: int) -> dict[str, float] | None:
        """The engine's overheads outside the layers for this model (newest profile)."""
        row = self.conn.execute(
            "SELECT overhead_s, last_stage_overhead_s, send_s, step_overhead_s FROM pipe_overheads "
            "WHERE model_key = ? AND micro_batch_size = ?", [mkey, micro_batch_size]).fetchone()
        if row is None:
            return None
        return dict(zip(("overhead_s", "last_stage_overhead_s", "send_s", "step_overhead_s"), row))

    def config_step_times(self, mkey: str) -> dict[str, dict[str, float]]:
        """Measured step time per config of a model: {config_key: {mean, var, p50, p95, count}}
        (var: the attempts' per-step variances pooled, each around its own mean)."""
        out: dict[str, dict[str, float]] = {}
        q = ("SELECT a.config_key, a.step_count, a.step_mean, a.step_var, a.step_p50, a.step_p95 "
             "FROM attempts a JOIN jobs j ON j.id = a.job WHERE j.model_key = ? AND a.step_count > 0")
        acc: dict[str, list[tuple[int, float, float, float, float]]] = {}
        for key, n, mean, var, p50, p95 in self.conn.execute(q, [mkey]):
            acc.setdefault(key, []).append((n, mean, var or 0.0, p50, p95))
        for key, per_attempt in acc.items():
            n = sum(a[0] for a in per_attempt)
            out[key] = {"count": n, "mean": sum(a[0] * a[1] for a in per_attempt) / n,
                        "var": sum(a[0] * a[2] for a in per_attempt) / n,
                        "p50": sum(a[0] * a[3] for a in per_attempt) / n,
                        "p95": max(a[4] for a in per_attempt)}
        return out

    def setup_times(self, mkey: str) -> list[float]:
        """Measured setup seconds (start to first step) of every attempt of this model."""
        return [r[0] for r in self.conn.execute(
            "SELECT a.setup_s FROM attempts a JOIN jobs j ON j.id = a.job WHERE j.model_key = ? "
            "AND a.setup_s IS NOT NULL", [mkey])]

    def recent_errors(self, limit: int = 20, user: str | None = None) -> list[dict[str, Any]]:
        """Predicted vs actual step time and JCT (with the predicted p10-p90 band) of the most
        recent finished, planned jobs; ``user``: that user's only (a plan learns from its own
        user's runs: another's events cannot steer it)."""
        mine = "AND user = ? " if user is not None else ""
        return [dict(r) for r in self._named(
            "SELECT job_id, name, predicted_step_s, actual_step_s, predicted_jct_s, actual_jct_s, "
            "predicted_jct_p10_s, predicted_jct_p90_s FROM jobs WHERE predicted_step_s IS NOT NULL "
            f"AND actual_step_s IS NOT NULL {mine}ORDER BY end_time DESC LIMIT ?",
            [*([user] if user is not None else []), limit])]

    def measured_hardware(self, partition: str | None, device: str, user: str,
                          limit: int = 20) -> MeasuredHardware | None:
        """What the ``limit`` most recent launches of ``user`` on ``partition`` measured of their
        ``device`` hardware (pipeswift_launch.probe), as medians; None when none measured. Only
        that user's own: the numbers come from their events, which another user cannot write."""
        rows = self.conn.execute(
            "SELECT a.p2p_latency_s, a.p2p_bandwidth, a.device_memory, a.host_cores, a.ranks_per_host, "
            "a.nodes, a.stages * a.data_parallel FROM attempts a "
            "JOIN jobs j ON a.job = j.id WHERE j.partition IS ? AND a.device = ? AND j.user = ? "
            "AND (a.p2p_latency_s IS NOT NULL OR a.device_memory IS NOT NULL) "
            "ORDER BY a.start_time DESC LIMIT ?", [partition, device, user, limit]).fetchall()
        if not rows:
            return None
        lat = [r[0] for r in rows if r[0] is not None and r[0] > 0]
        bw = [r[1] for r in rows if r[1] is not None and r[1] > 0]
        mem = [r[2] for r in rows if r[2] is not None and r[2] > 0]
        cores = [r[3] for r in rows if r[3] is not None and r[3] > 0]
        shared = [_nodes_on_a_host(*r[4:]) for r in rows]
        return MeasuredHardware(median_of(lat) if lat else None, median_of(bw) if bw else None,
                                float(median_of(mem)) if mem else None, len(rows),
                                int(median_of(cores)) if cores else None,
                                max((n for n in shared if n is not None), default=None))

    def preemptions_per_hour(self, partition: str | None, days: float = 30.0,
                             now: float | None = None) -> float:
        """Preemptions per hour of run time on a partition over the last ``days`` (recent
        behaviour, and an index range scan however long the history)."""
        since = (now if now is not None else _time.time()) - days * 86400
        row = self.conn.execute(
            f"SELECT SUM(preempted), SUM(run_s) FROM job_rollup WHERE partition IS ? AND submit >= ? AND {SLURMS_OWN}",
            [partition, since]).fetchone()
        pre, run = row if row else (None, None)
        return (pre or 0) / (run / 3600) if run else 0.0

    def failures(self, partition: str | None, days: float = 30.0, now: float | None = None,
                 user: str | None = None) -> tuple[float, float]:
        """(failures, node-hours) of pswift's attempts on a partition over the last ``days``: a
        failure is a restart inside an attempt, or an attempt that ended crashed, hung or killed
        (pipeswift_slurm.planning.interval smooths the rate). ``user``: that user's jobs only (their
        events are theirs to write: another user's cannot steer this user's interval)."""
        since = (now if now is not None else _time.time()) - days * 86400
        row = self.conn.execute(
            "SELECT SUM(COALESCE(a.restarts, 0) + (a.ended IN ('crashed', 'hung', 'killed'))), "
            "SUM(a.nodes * (a.end_time - a.start_time)) / 3600.0 FROM attempts a JOIN jobs j ON a.job = j.id "
            "WHERE j.partition IS ? AND a.start_time >= ? AND a.end_time > a.start_time AND a.nodes > 0"
            + (" AND j.user = ?" if user is not None else ""),
            [partition, since, *([user] if user is not None else [])]).fetchone()
        return (float(row[0] or 0), float(row[1] or 0.0)) if row else (0.0, 0.0)

    def partition_waits(self, partition: str | None, nodes: int, limit: int = 1000) -> list[float]:
        """Past queue waits of ``nodes``-node jobs on a partition, newest first: Slurm's own
        submit and start times (jobcomp, sacct), never what a user's plan.json says."""
        rows = self.conn.execute(
            f"SELECT queue_s FROM job_rollup WHERE partition IS ? AND nodes = ? AND queue_s IS NOT NULL AND {SLURMS_OWN} "
            "ORDER BY submit DESC LIMIT ?", [partition, nodes, limit])
        return [float(r[0]) for r in rows if r[0] is not None and r[0] >= 0]

    def limit_shares(self, partitions: list[str], min_jobs: int, limit: int = 2000
                     ) -> tuple[dict[str, float], dict[str, float]]:
        """How much of their time limit ended Slurm jobs really ran (elapsed / limit of the last
        attempt, median over the newest ``limit`` jobs of each partition): by user and by
        partition, each only with at least ``min_jobs`` jobs."""
        users: dict[str, list[float]] = {}
        parts: dict[str, list[float]] = {}
        for part in partitions:
            rows = self.conn.execute(
                f"SELECT user, last_elapsed_s / limit_s FROM job_rollup WHERE partition IS ? AND "
                f"limit_s > 0 AND last_elapsed_s >= 0 AND {SLURMS_OWN} ORDER BY submit DESC LIMIT ?", [part, limit])
            for user, share in rows:
                parts.setdefault(part, []).append(float(share))
                if user:
                    users.setdefault(user, []).append(float(share))
        def medians(d: dict[str, list[float]]) -> dict[str, float]:
            return {k: float(median_of(v)) for k, v in d.items() if len(v) >= min_jobs}
        return medians(users), medians(parts)

    # ------------------------------------------------------------------------- the reports
    def slurm_attempts(self, sel: Selection) -> Iterator[sqlite3.Row]:
        """Slurm's records (one per attempt) by cluster, job and start: cluster, job_id, start,
        end, submit, name, user, partition, state, node_count, procs, work_dir. The selection's
        states apply to whole jobs: the caller filters those."""
        where, params = sel._replace(states=()).where("s", "state")
        return self._named(
            "SELECT s.cluster, s.job_id, s.start, s.end, s.submit, s.name, s.user, s.partition, "
            "s.state, s.node_count, s.procs, s.work_dir, s.account, s.qos FROM slurm_jobs s WHERE "
            + where + " ORDER BY s.cluster, s.job_id, s.start", params)

    def array_members(self, cluster: str, array_job_id: str) -> list[dict[str, Any]]:
        """The tasks of job array ``array_job_id`` (a pswift run of members is one), each the
        Slurm job its roll-up holds, by task: task, job_id, attempts, requeued (attempts Slurm put
        back in the queue: a preemption, a requeue), submit, last_end, state (the newest
        attempt's), nodes (its node list), node_s."""
        return [dict(r) for r in self._named(
            f"SELECT t.task, r.job_id, r.attempts, (SELECT COUNT(*) FROM slurm_jobs x WHERE x.cluster = r.cluster "
            f"AND x.job_id = r.job_id AND x.state IN {STOPPED}) AS requeued, r.submit, r.end AS last_end, "
            f"r.last_state AS state, r.nodelist AS nodes, COALESCE(r.node_s, 0.0) AS node_s FROM job_rollup r "
            f"JOIN (SELECT DISTINCT cluster, job_id, array_task_id AS task FROM slurm_jobs WHERE array_job_id = ? "
            f"AND (cluster = ? OR ? = '') AND source != 'pswift') t ON t.cluster = r.cluster AND t.job_id = r.job_id "
            f"ORDER BY t.task, r.job_id", [array_job_id, cluster, cluster])]

    def listing_rows(self, sel: Selection, keys: list[str], render: str | None = None,
                     limit: int | None = None) -> Iterator[tuple[Any, ...]]:
        """The selected jobs in numeric job-id order (streamed from the job_num index), each as
        the values of the listing's ``keys`` (LISTING_SQL), or as one line ``render`` (SQL over
        those expressions) makes of them; then the job id and its work directory."""
        where, params = sel.where("r")
        cols = render if render is not None else ", ".join(LISTING_SQL[k] for k in keys)
        tail = f" LIMIT {int(limit)}" if limit else ""
        return self.conn.execute(f"SELECT {cols}, r.job_id, r.work_dir FROM job_rollup r WHERE {where} "
                                 f"ORDER BY r.job_num, r.job_id{tail}", params)

    def rollup_of(self, cluster: str, job_id: str) -> sqlite3.Row | None:
        """One job's roll-up row (None when Slurm has no record of it)."""
        return next(self._named("SELECT * FROM job_rollup WHERE cluster = ? AND job_id = ?",
                                [cluster, job_id]), None)

    def last_known(self, job_id: str, run_dir: str | None) -> dict[str, Any] | None:
        """What the history last knew of a job Slurm has forgotten: Slurm's own record of it
        (jobcomp plugin or sacct; the one run from ``run_dir`` first, several clusters may
        reuse an id), else pswift's: {"state", "restarts"}."""
        for r in self._named(
                "SELECT last_state AS state, attempts - 1 AS restarts FROM job_rollup WHERE job_id = ? "
                "ORDER BY work_dir IS NOT ? , end DESC LIMIT 1", [job_id, run_dir]):
            return dict(r)
        for r in self._named(
                "SELECT state, NULL AS restarts FROM jobs WHERE job_id = ? ORDER BY run_dir IS NOT ?, id DESC "
                "LIMIT 1", [job_id, run_dir]):
            return dict(r)
        return None

    def pswift_runs(self) -> dict[tuple[str, str | None], sqlite3.Row]:
        """Every pswift run by its directory and job id (a shared scratch may hold several jobs
        at one path): run_dir, id, job_id, name, user, partition, state, submit_time,
        predicted_jct_s, cluster."""
        return {(r["run_dir"], r["job_id"]): r for r in self._named(
            "SELECT run_dir, id, job_id, name, user, partition, state, submit_time, predicted_jct_s, cluster "
            "FROM jobs ORDER BY id")}

    def run_dirs(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT run_dir FROM jobs")}

    def job_attempts(self, job: int) -> list[dict[str, Any]]:
        """A pswift job's attempts, in order, each a dict of its figures."""
        return [dict(r) for r in self._named(
            "SELECT attempt, nodes, stages, data_parallel, micro_batches, start_step, end_step, "
            "ended, setup_s, load_s, checkpoint_s, train_s, step_mean, step_var, step_p50, "
            "step_p95, start_time, end_time, config_key FROM attempts WHERE job = ? "
            "ORDER BY attempt", [job])]

    def job_relayouts(self, run_dir: str) -> list[dict[str, Any]]:
        """A pswift run's in-job re-layouts and growths, oldest first, each as
        eventfold.relayout_outcomes / growth_outcomes gives them, with its ``kind``."""
        return [{**dict(r), "from": json.loads(r["boundaries_from"] or "null"),
                 "to": json.loads(r["boundaries_to"] or "null")} for r in self._named(
            "SELECT r.kind, r.attempt, r.step, r.boundaries_from, r.boundaries_to, r.nodes_from, "
            "r.nodes_to, r.nodes_got, r.step_s, r.predicted_step_s, r.measured_step_s, "
            "r.predicted_gain_s, r.measured_gain_s, r.predicted_cost_s, r.measured_cost_s "
            "FROM relayouts r JOIN jobs j ON j.id = r.job WHERE j.run_dir = ? "
            "ORDER BY r.attempt, r.step", [run_dir])]

    def rollups(self, by: str, sel: Selection) -> Iterator[tuple[Any, ...]]:
        """One narrow tuple per selected job from the roll-up table: (the ``by`` column,
        attempts, preempted, queue_s, run_s, jct_s, wasted_s)."""
        if by not in ROLLUP_KEYS:
            raise ValueError(by)
        where, params = sel.where("r")
        return self.conn.execute(f"SELECT r.{by}, attempts, preempted, queue_s, run_s, jct_s, wasted_s "
                                 f"FROM job_rollup r WHERE {where}", params)

    def queue_waits(self, sel: Selection) -> list[float]:
        """Every selected job's queue wait, sorted."""
        where, params = sel.where("r")
        return sorted(w for (w,) in self.conn.execute(
            f"SELECT queue_s FROM job_rollup r WHERE queue_s IS NOT NULL AND {where}", params))
