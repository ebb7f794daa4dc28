"""`pswift history usage|utilisation|efficiency|waits|failures`: sreport / seff / XDMoD style
reports over the history, each a few lines over :mod:`pipeswift_slurm.reports.accounting`, with sacct's selection
and output options and ``--plot``."""

from __future__ import annotations

# Imports inside functions: each command imports the library it runs when it runs, so `pswift
# --help` and `pswift sbatch` load none of the others

import os
from pathlib import Path
from typing import Any, Callable

import click

from pipeswift_slurm.cli.common import _db_option, _errors, _nothing_selected, _open, _output, _print, _select, _warn, history

_plot_option = click.option("--plot", type=click.Path(path_type=Path),
                            help="Also write the report as a PNG (labelled axes, units).")
_by = click.Choice(["user", "account", "partition", "qos"])


def _finish(db: Path | None, make: Callable[[Any], Any], out: Any, plot: Path | None,
            sel: Any = None) -> None:
    """Make the report over the history (``make(history)``), print it, draw it if asked (its
    title names the selection ``sel``)."""
    h = _open(db)
    try:
        rep = make(h)
    finally:
        h.close()
    _nothing_selected(rep.rows)
    _print(rep.rows, rep.columns, out)
    if plot is not None:
        from pipeswift_slurm.reports.accounting import draw
        draw(rep, plot, sel.describe() if sel is not None else "all jobs")
        _warn(f"plot written to {plot}")


@history.command("usage")
@_select
@click.option("--by", type=_by, default="account", show_default=True, help="Group by.")
@click.option("--per", type=click.Choice(["day", "week", "month"]), help="Time buckets (default: one total).")
@click.option("--top", type=click.IntRange(min=1), help="Only the N groups (and buckets) with the most node-hours.")
@_output
@_plot_option
@_errors
def history_usage(db: Path | None, sel: Any, by: str, per: str | None, top: int | None, out: Any,
                  plot: Path | None) -> None:
    """Node-, CPU- and GPU-hours by user, account, partition or QOS, per day, week or month
    (sreport's cluster/account utilisation; an attempt counts where it started).

    Examples:

        pswift history usage --by account --per week -S now-60days --plot usage.png

        pswift history usage --by user --top 10
    """
    from pipeswift_slurm.reports.accounting import usage
    _finish(db, lambda h: usage(h, by, sel, per, top), out, plot, sel)


@history.command("utilisation")
@_select
@click.option("--per", type=click.Choice(["day", "week", "month"]), default="day", show_default=True)
@click.option("--nodes", "capacity", type=click.IntRange(min=1),
              help="Nodes the partition has (default: Slurm's count for the one -r names).")
@_output
@_plot_option
@_errors
def history_utilisation(db: Path | None, sel: Any, per: str, capacity: int | None, out: Any,
                        plot: Path | None) -> None:
    """A partition's busy node-hours per day, week or month and, with its node count, the
    share of its capacity (each attempt split exactly across the buckets it ran in).

    Example:

        pswift history utilisation -r low --per day -S now-30days --plot util.png
    """
    from pipeswift_slurm.reports.accounting import utilisation
    if capacity is None and len(sel.partitions) == 1:
        from pipeswift_slurm.slurm import client as slurm
        capacity = slurm.partition_node_count(sel.partitions[0])
        if capacity is None:
            _warn(f"warning: Slurm does not say how many nodes {sel.partitions[0]} has; pass --nodes N "
                  f"for the utilisation column")
    _finish(db, lambda h: utilisation(h, sel, per, capacity), out, plot, sel)


@history.command("efficiency")
@_select
@click.option("--by", type=click.Choice(["job", "user", "account", "partition", "qos"]), default="user",
              show_default=True, help="Per job (seff) or aggregated.")
@_output
@_plot_option
@_errors
def history_efficiency(db: Path | None, sel: Any, by: str, out: Any, plot: Path | None) -> None:
    """Time used vs the limit, CPU time vs allocated CPU time, MaxRSS vs requested memory
    (seff / reportseff), per job or aggregated; unknown where Slurm recorded nothing.

    Examples:

        pswift history efficiency --by job -u alice -S now-7days

        pswift history efficiency --by account --plot eff.png
    """
    from pipeswift_slurm.reports.accounting import efficiency
    _finish(db, lambda h: efficiency(h, by, sel), out, plot, sel)


@history.command("waits")
@_select
@click.option("--by", type=click.Choice(["qos", "size", "partition", "user", "account"]), default="qos",
              show_default=True, help="Group by (size: node count, power-of-two bins).")
@_output
@_plot_option
@_errors
def history_waits(db: Path | None, sel: Any, by: str, out: Any, plot: Path | None) -> None:
    """Queue wait p50, p95 and mean by QOS, job size or another group.

    Example:

        pswift history waits --by size -r low --plot waits.png
    """
    from pipeswift_slurm.reports.accounting import waits
    _finish(db, lambda h: waits(h, by, sel), out, plot, sel)


@history.command("failures")
@_select
@_output
@_plot_option
@_errors
def history_failures(db: Path | None, sel: Any, out: Any, plot: Path | None) -> None:
    """Jobs by final state and exit code, most frequent first, with their share and users.

    Example:

        pswift history failures -S now-7days -s F,TO,OOM,NF
    """
    from pipeswift_slurm.reports.accounting import failures
    _finish(db, lambda h: failures(h, sel), out, plot, sel)


@history.command("serve")
@_db_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 exposes the history to the network).")
@click.option("--port", type=click.IntRange(0, 65535), default=8001, show_default=True)
@click.option("--metadata", "metadata_out", type=click.Path(path_type=Path),
              help="Only write the Datasette metadata (titles, units, canned queries, dashboard) here.")
@click.option("--everyone", is_flag=True,
              help="No token: every user who can reach the port reads what is served (an admin's choice).")
@click.option("--user", "only_user", metavar="NAME",
              help="Serve NAME's jobs only (an admin's preview of what NAME sees).")
@_errors
def history_serve(db: Path | None, host: str, port: int, metadata_out: Path | None, everyone: bool,
                  only_user: str | None) -> None:
    """Browse the history in Datasette, read-only: tables with titles and units, report views
    (usage_daily, job_efficiency, job_waits, failures, preemption_waste, jct_phases), canned
    queries and a dashboard at /-/dashboards/pswift. For one person by default: open the URL
    with the token it prints; other users of the host get 403. Read-only SQL for whoever may
    look (the dashboard draws with it); every query stops after 2 s. The database's owner (or
    root) sees every job; anyone else who can read it is served a private copy of their own.

    Example:

        pswift history serve --port 8001
    """
    import json
    from pipeswift_slurm.history.rows import current_user
    from pipeswift_slurm.reports.serve import metadata, serve, served_user
    from pipeswift_slurm.history.store import History
    h = History(db, create=False)   # a writer's open: Datasette serves the file itself, migrated, its views current
    path = h.path
    h.close()
    if metadata_out is not None:
        from pipeswift_slurm.userfiles import write_output
        blob = json.dumps(metadata(path, everyone), indent=2).encode()
        write_output(metadata_out, lambda f: f.write(blob))
        _warn(f"metadata written to {metadata_out}")
        return
    only_user = served_user(path, os.geteuid(), path.stat().st_uid, only_user, current_user())
    who = "to every user who can reach it" if everyone else "to whoever opens the token URL below"
    whose = f"{only_user}'s jobs in " if only_user else ""
    _warn(f"serving {whose}{path} read-only on http://{host}:{port}/ {who} (dashboard: /-/dashboards/pswift)")
    serve(path, host, port, everyone, only_user)
