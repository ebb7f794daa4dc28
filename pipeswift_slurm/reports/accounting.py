"""The reports admins expect (sreport, seff/reportseff, XDMoD), over any number of Slurm jobs in
the history, each a function returning rows, its columns (:class:`~.tabular.Col`) and how to draw it.

- usage: node-, CPU- and GPU-hours by user/account/partition/QOS, per day/week/month (an attempt
  counts in the bucket it started in, as sreport's job reports do) or in total (top users);
- utilisation: a partition's busy node-hours per bucket over what its nodes could give (each
  attempt split exactly across the buckets it ran in);
- efficiency: time used vs the limit, CPU time vs allocated CPU time, MaxRSS vs requested
  memory, per job or aggregated (unknown where Slurm recorded nothing: MaxRSS needs a
  jobacct_gather plugin);
- waits: queue wait p50/p95 by QOS, job size (nodes, power-of-two bins) or any group;
- failures: jobs by final state and exit code.
"""

from __future__ import annotations

# Imports inside functions: figures (matplotlib), only for --plot

import datetime as _dt
import time
from typing import Any, Iterator, NamedTuple

from pipeswift_slurm.history.store import History
from pipeswift_slurm.history.selection import Selection
from pipeswift_slurm.history.views import CPU_HOURS, GPU_HOURS, NODE_HOURS, SIZE_BIN
from pipeswift_slurm.stats import quantiles
from pipeswift_slurm.reports.tabular import Col

GROUP_KEYS = ("user", "account", "partition", "qos")
PERIODS = ("day", "week", "month")
#: each bucket's label: ISO weeks (2026-11-01, a Sunday, is 2026-W44; a week across New Year is one)
_BUCKET_SQL = {"day": "%Y-%m-%d", "week": "%G-W%V", "month": "%Y-%m"}


class Report(NamedTuple):
    rows: list[dict[str, Any]]
    columns: list[Col]
    #: how the plot reads it: (x key, y keys, y label, title, stacked-by key or None)
    plot: tuple[str, tuple[str, ...], str, str, str | None]


def usage(h: History, by: str, sel: Selection, per: str | None = None, top: int | None = None) -> Report:
    if by not in GROUP_KEYS:
        raise ValueError(by)
    where, params = sel.where("s", "state")
    day = _local_day_sql(h, "s.start") if per else "0"
    sql = (f"SELECT {day} AS day, s.{by} AS key, COUNT(*) AS attempts, "
           f"{NODE_HOURS} AS node_hours, {CPU_HOURS} AS cpu_hours, {GPU_HOURS} AS gpu_hours "
           f"FROM slurm_jobs s WHERE s.end IS NOT NULL AND {where} GROUP BY day, key")
    merged: dict[tuple[str, Any], dict[str, Any]] = {}
    epoch = _dt.date(1970, 1, 1)
    for d, key, attempts, node_h, cpu_h, gpu_h in h.conn.execute(sql, params):
        bucket = (epoch + _dt.timedelta(days=d)).strftime(_BUCKET_SQL[per]) if per else "all"
        r = merged.setdefault((bucket, key), {"bucket": bucket, "key": key, "attempts": 0, "node_hours": None,
                                              "cpu_hours": None, "gpu_hours": None})
        r["attempts"] += attempts
        for k, v in (("node_hours", node_h), ("cpu_hours", cpu_h), ("gpu_hours", gpu_h)):
            if v is not None:
                r[k] = (r[k] or 0.0) + v
    rows = sorted(merged.values(), key=lambda r: (r["bucket"], -(r["node_hours"] or 0)))
    if top:
        rows = sorted(rows, key=lambda r: -(r["node_hours"] or 0))[:top]
    cols = [Col("bucket", per.capitalize() if per else "Period", "text", 10), Col("key", by.capitalize(), "text", 10),
            Col("attempts", "Attempts", "int", 8), Col("node_hours", "NodeHours", "h", 10),
            Col("cpu_hours", "CPUHours", "h", 10), Col("gpu_hours", "GPUHours", "h", 10)]
    title = f"node-hours by {by}" + (f" per {per}" if per else "")
    return Report(rows, cols, ("bucket" if per else "key", ("node_hours",), "node-hours", title,
                               "key" if per else None))


def _local_day_sql(h: History, col: str) -> str:
    """SQL for the local calendar day (days since 1970-01-01) of the epoch column ``col``, exact
    across daylight-saving changes: the UTC offset of each span between the changes the
    history's time range holds (cheaper than SQLite's 'localtime' on every row)."""
    lo, hi = h.conn.execute("SELECT MIN(start), MAX(start) FROM slurm_jobs").fetchone()
    if lo is None:
        return f"CAST({col} / 86400 AS INTEGER)"
    spans = _offset_spans(int(lo), int(hi) + 1)
    case = " ".join(f"WHEN {col} < {start} THEN {off}" for (start, _), (_, off) in zip(spans[1:], spans))
    offset = f"(CASE {case} ELSE {spans[-1][1]} END)" if case else str(spans[0][1])
    return f"CAST(({col} + {offset}) / 86400 AS INTEGER)"


def _offset_spans(lo: int, hi: int) -> list[tuple[int, int]]:
    """(start, local UTC offset in seconds) of each span in [lo, hi] with one offset."""
    def offset(t: int) -> int:
        return time.localtime(t).tm_gmtoff
    spans = [(lo, offset(lo))]
    t = lo
    while t < hi:
        nxt = min(t + 86400, hi)
        if offset(nxt) != spans[-1][1]:
            a, b = t, nxt                       # the change lies in (a, b]: to the second
            while b - a > 1:
                m = (a + b) // 2
                a, b = (m, b) if offset(m) == spans[-1][1] else (a, m)
            spans.append((b, offset(b)))
        t = nxt
    return spans


def _bucket_start(t: float, per: str) -> _dt.datetime:
    d = _dt.datetime.fromtimestamp(t).replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "week":
        return d - _dt.timedelta(days=d.weekday())
    if per == "month":
        return d.replace(day=1)
    return d


def _next_bucket(d: _dt.datetime, per: str) -> _dt.datetime:
    if per == "month":
        return (d.replace(day=28) + _dt.timedelta(days=4)).replace(day=1)
    return d + _dt.timedelta(days=7 if per == "week" else 1)


def _split(start: float, end: float, per: str) -> Iterator[tuple[_dt.datetime, float]]:
    """(bucket start, seconds of [start, end) inside it) for every bucket the span touches."""
    b = _bucket_start(start, per)
    while b.timestamp() < end:
        nxt = _next_bucket(b, per)
        lo, hi = max(start, b.timestamp()), min(end, nxt.timestamp())
        if hi > lo:
            yield b, hi - lo
        b = nxt


def utilisation(h: History, sel: Selection, per: str, capacity_nodes: int | None) -> Report:
    """Busy node-hours per bucket; with the partition's node count, the share of its capacity."""
    where, params = sel.where("s", "state")
    busy: dict[_dt.datetime, float] = {}
    for start, end, nodes in h.conn.execute(
            f"SELECT s.start, s.end, s.node_count FROM slurm_jobs s WHERE s.end > s.start "
            f"AND s.node_count IS NOT NULL AND {where}", params):
        for b, secs in _split(start, end, per):
            busy[b] = busy.get(b, 0.0) + secs * nodes
    rows = []
    for b in sorted(busy):
        span = _next_bucket(b, per).timestamp() - b.timestamp()
        cap = capacity_nodes * span if capacity_nodes else None
        rows.append({"bucket": b.strftime(_BUCKET_SQL[per]), "busy_node_hours": busy[b] / 3600,
                     "capacity_node_hours": cap / 3600 if cap else None,
                     "utilisation": busy[b] / cap if cap else None})
    cols = [Col("bucket", per.capitalize(), "text", 10), Col("busy_node_hours", "BusyNodeHours", "h", 13),
            Col("capacity_node_hours", "CapacityNodeHours", "h", 17), Col("utilisation", "Utilisation", "ratio", 11)]
    y = ("utilisation",) if capacity_nodes else ("busy_node_hours",)
    return Report(rows, cols, ("bucket", y, "utilisation (%)" if capacity_nodes else "busy node-hours",
                               f"utilisation per {per}", None))


def efficiency(h: History, by: str, sel: Selection) -> Report:
    """Per job (``by="job"``) or aggregated: time, CPU and memory efficiency (seff's figures);
    aggregated CPU efficiency is weighted by allocated CPU time."""
    where, params = sel.where("r")
    eff = ("r.last_elapsed_s / NULLIF(r.limit_s, 0)", "r.cpu_time_s / NULLIF(r.cpu_s, 0)",
           "r.max_rss_mb / NULLIF(r.req_mem_mb, 0)")
    if by == "job":
        sql = (f"SELECT r.job_id AS key, 1 AS jobs, r.user AS user, {eff[0]} AS time_eff, {eff[1]} AS cpu_eff, "
               f"{eff[2]} AS mem_eff FROM job_rollup r WHERE {where} ORDER BY r.job_num, r.job_id")
    elif by in GROUP_KEYS:
        sql = (f"SELECT r.{by} AS key, COUNT(*) AS jobs, AVG({eff[0]}) AS time_eff, "
               f"SUM(CASE WHEN r.cpu_time_s IS NOT NULL THEN r.cpu_time_s END) / "
               f"NULLIF(SUM(CASE WHEN r.cpu_time_s IS NOT NULL THEN r.cpu_s END), 0) AS cpu_eff, "
               f"AVG({eff[2]}) AS mem_eff FROM job_rollup r WHERE {where} GROUP BY key ORDER BY key")
    else:
        raise ValueError(by)
    rows = [dict(r) for r in h._named(sql, params)]
    cols = [Col("key", "JobID" if by == "job" else by.capitalize(), "text", 10), Col("jobs", "Jobs", "int", 6),
            Col("time_eff", "TimeEff", "ratio", 8), Col("cpu_eff", "CPUEff", "ratio", 8),
            Col("mem_eff", "MemEff", "ratio", 8)]
    if by == "job":
        cols.insert(1, Col("user", "User", "text", 9))
    return Report(rows, cols, ("key", ("time_eff", "cpu_eff", "mem_eff"), "efficiency (%)",
                               f"efficiency by {by}", None))


def waits(h: History, by: str, sel: Selection) -> Report:
    """Queue wait per group: jobs, p50, p95, mean (a job's wait: before its first start and
    between its attempts); ``by="size"`` bins jobs by node count."""
    where, params = sel.where("r")
    if by != "size" and by not in GROUP_KEYS:
        raise ValueError(by)
    col = SIZE_BIN if by == "size" else f"r.{by}"
    per: dict[Any, list[float]] = {}
    for key, wait in h.conn.execute(f"SELECT {col}, r.queue_s FROM job_rollup r WHERE r.queue_s IS NOT NULL "
                                    f"AND {where}", params):
        per.setdefault(key, []).append(wait)

    def order(k: Any) -> Any:
        if by != "size":
            return str(k)
        return (k == "unknown", int(str(k).split("-")[0].rstrip("+")) if k != "unknown" else 0)
    rows = []
    for k, ws in sorted(per.items(), key=lambda kv: order(kv[0])):
        p50, p95 = quantiles(ws, (0.5, 0.95), clean=True)
        rows.append({"key": k, "jobs": len(ws), "wait_p50_s": p50, "wait_p95_s": p95, "wait_mean_s": sum(ws) / len(ws)})
    label = "Nodes" if by == "size" else by.capitalize()
    cols = [Col("key", label, "text", 10), Col("jobs", "Jobs", "int", 8), Col("wait_p50_s", "WaitP50", "s", 10),
            Col("wait_p95_s", "WaitP95", "s", 10), Col("wait_mean_s", "WaitMean", "s", 10)]
    return Report(rows, cols, ("key", ("wait_p50_s", "wait_p95_s"), "queue wait", f"queue wait by {label.lower()}", None))


def failures(h: History, sel: Selection) -> Report:
    """Jobs by final state and exit code, most frequent first, with each one's share."""
    where, params = sel.where("r")
    rows = [dict(r) for r in h._named(
        f"SELECT COALESCE(r.last_state, 'unknown') AS state, COALESCE(r.exit_code, '') AS exit_code, "
        f"COUNT(*) AS jobs, COUNT(DISTINCT r.user) AS users FROM job_rollup r WHERE {where} "
        f"GROUP BY 1, 2 ORDER BY jobs DESC, state, exit_code", params)]
    total = sum(r["jobs"] for r in rows) or 1
    for r in rows:
        r["share"] = r["jobs"] / total
        r["label"] = f"{r['state']} {r['exit_code']}".strip()
    cols = [Col("state", "State", "text", 14), Col("exit_code", "ExitCode", "text", 8), Col("jobs", "Jobs", "int", 8),
            Col("share", "Share", "ratio", 6), Col("users", "Users", "int", 6)]
    return Report(rows, cols, ("label", ("jobs",), "jobs", "jobs by final state and exit code", None))


def draw(rep: Report, path: Any, selection: str = "all jobs") -> None:
    """One PNG of a report: bars per x value (stacked by the report's series key, the 8 largest
    and the rest as "other"), labelled axes with units, a value not on record drawn as
    "unknown" (never as 0), a 100 % line on shares, and the selection in the title."""
    from pipeswift_slurm.figures import pyplot, save
    plt = pyplot()
    x_key, y_keys, y_label, title, stack = rep.plot
    kinds = {c.key: c for c in rep.columns}
    xs = list(dict.fromkeys(str(r[x_key]) for r in rep.rows))
    fig, ax = plt.subplots(figsize=(max(8, min(24, 0.4 * len(xs) + 4)), 5))
    kind = kinds[y_keys[0]].kind
    top = max((r[k] or 0.0 for r in rep.rows for k in y_keys), default=0.0)
    scale, unit = 1.0, ""
    if kind == "ratio":
        scale, unit = 100.0, ""
    elif kind == "s":
        scale, unit = ((1.0, " (s)") if top < 120 else (1 / 60, " (min)") if top < 7200 else (1 / 3600, " (h)"))
    if stack:
        totals: dict[str, float] = {}
        for r in rep.rows:
            totals[str(r[stack])] = totals.get(str(r[stack]), 0.0) + (r[y_keys[0]] or 0.0)
        keep = sorted(totals, key=lambda k: -totals[k])[:8]
        series: dict[str, list[float]] = {k: [0.0] * len(xs) for k in [*keep, "other"]}
        for r in rep.rows:
            k = str(r[stack]) if str(r[stack]) in keep else "other"
            series[k][xs.index(str(r[x_key]))] += (r[y_keys[0]] or 0.0) * scale
        bottom = [0.0] * len(xs)
        for k, vals in series.items():
            if any(vals):
                ax.bar(range(len(xs)), vals, bottom=bottom, label=k)
                bottom = [b + v for b, v in zip(bottom, vals)]
        ax.legend(title=kinds[stack].header, fontsize=8)
    else:
        width = 0.8 / len(y_keys)
        for i, k in enumerate(y_keys):
            at = [j + i * width - 0.4 + width / 2 for j in range(len(xs))]
            known = [(x, r[k] * scale) for x, r in zip(at, rep.rows) if r[k] is not None]
            ax.bar([x for x, _ in known], [v for _, v in known], width, label=kinds[k].header)
            for x, r in zip(at, rep.rows):
                if r[k] is None:
                    ax.text(x, 0, "unknown", rotation=90, ha="center", va="bottom", fontsize=7, color="0.4")
        if len(y_keys) > 1:
            ax.legend(fontsize=8)
    if kind == "ratio":
        ax.axhline(100, color="0.3", linestyle="--", linewidth=1)
        ax.text(ax.get_xlim()[1], 100, " 100 %", va="center", ha="left", fontsize=8, color="0.3")
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels(xs, fontsize=7, rotation=0 if len(xs) < 10 else 90)
    ax.set_xlabel(kinds[x_key].header if x_key in kinds else "state, exit code")
    ax.set_ylabel(y_label + unit)
    ax.set_title(f"{title} ({selection})", loc="left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save(fig, path)
