"""The launcher's one port to Slurm: what a job asks of Slurm about itself, as a small typed
interface. pipeswift_slurm.slurm.client (the one module that talks to Slurm) implements it;
a unit test puts a fake in its place with :func:`use`. Launcher modules call :func:`slurm`
and never import the client themselves."""

from __future__ import annotations

from typing import Protocol

from pipeswift_slurm.slurm import client
from pipeswift_slurm.slurm.cluster import ClusterState
from pipeswift_slurm.slurm.records import JobInfo


class SlurmPort(Protocol):
    def requeue(self, job_id: str, exclude: str | None = None, nodes_needed: int = 1) -> bool:
        """Requeue the job; with ``exclude``, keep its next attempt off that node (whether it did)."""

    def set_node_range(self, job_id: str, node_range: str) -> None:
        """A pending (requeued) job's node request, ``min-max``."""

    def set_time_limit(self, job_id: str, limit_s: int, time_min_s: int | None = None) -> None:
        """A pending (requeued) job's time limit and --time-min."""

    def forbid_requeue(self, job_id: str) -> None:
        """Keep Slurm from requeueing the job when it ends."""

    def shrink_job(self, job_id: str, nodelist: str) -> None:
        """Give the running job's nodes outside ``nodelist`` back."""

    def being_preempted(self, job_id: str, attempt: int | None = None) -> bool:
        """Whether Slurm is preempting the job (or already requeued it past ``attempt``)."""

    def requeues_preempted_jobs(self) -> bool:
        """Whether Slurm requeues a preempted job itself."""

    def cluster_state(self, now: float | None = None) -> ClusterState:
        """Every node and the running and pending jobs."""

    def job_info(self, job_id: str) -> JobInfo | None:
        """The job as Slurm sees it, None once purged."""

    def cancel_pending(self, array_job_id: str) -> None:
        """Cancel the job array's tasks that are still queued."""

    def set_array_throttle(self, array_job_id: str, at_once: int) -> None:
        """How many of the job array's tasks may run at once."""


_port: list[SlurmPort] = [client]


def slurm() -> SlurmPort:
    """The port in use: Slurm's client, or a test's fake."""
    return _port[0]


def use(port: SlurmPort) -> SlurmPort:
    """Put ``port`` in the client's place (a unit test's fake); returns the one it replaces."""
    old, _port[0] = _port[0], port
    return old
