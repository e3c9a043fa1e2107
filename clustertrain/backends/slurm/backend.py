"""``SlurmBackend``: a Slurm cluster behind clustertrain's one backend interface; its checks are
preflight's (the cluster's limits) and the files the job names."""

from __future__ import annotations

from collections.abc import Sequence

from clustertrain.backends.base import Backend
from clustertrain.jobstate import JOB_IDS, Accounting, Allocation, Holding, JobState
from clustertrain.render import RenderedJob
from clustertrain.runs import Run

from . import preflight as preflight_checks
from .cluster_info import ClusterInfo
from .commands import Slurm, checked_job_id, checked_node


class SlurmBackend(Backend):
    """A Slurm cluster, through its commands (:class:`Slurm`); preflight reads its limits."""

    name = "slurm"
    job_ids = JOB_IDS[name]
    accepted = "queued"
    no_accounting = "no accounting: sacct answered nothing, no slurmdbd?"

    @staticmethod
    def cancel_command(job_id: str) -> str:
        return f"scancel {job_id}"

    def __init__(self, slurm: Slurm | None = None) -> None:
        self.slurm = slurm or Slurm()
        self._cluster: ClusterInfo | None = None

    def fit(self, job: RenderedJob) -> RenderedJob:
        return preflight_checks.fit(job, self._cluster_info())

    def check(self, job: RenderedJob, preflight: bool = True) -> None:
        if preflight:
            preflight_checks.check(job.spec, self._cluster_info())
            preflight_checks.check_files(job)

    def _cluster_info(self) -> ClusterInfo:
        """The cluster's limits, asked once for a submission's fit and check."""
        if self._cluster is None:
            self._cluster = self.slurm.cluster_info()
        return self._cluster

    def submit(self, job: RenderedJob) -> str:
        return self.slurm.submit(job)

    def state(self, run: Run) -> JobState:
        return self.slurm.state(run.job_id)

    def cancel(self, run: Run) -> None:
        self.slurm.cancel(run.job_id)

    def accounting(self, run: Run) -> Accounting | None:
        return self.slurm.accounting(run.job_id)

    def allocations(self, run: Run) -> tuple[Allocation, ...] | None:
        return self.slurm.allocations(run.job_id)

    def holding(self, run: Run) -> Holding:
        return self.slurm.holding(run.job_id)

    def node_command(
        self, run: Run, argv: Sequence[str], node: str | None = None, pty: bool = False
    ) -> list[str]:
        """``srun`` into the job's allocation beside its steps (``--overlap``), one task on
        each node (or on ``node``, with ``--pty``: the task's terminal is this one); Slurm's own
        configuration, as every other call. Every node is counted out: an srun from outside the
        allocation has no SLURM_NNODES to default to, and would start one task on one node."""
        words = ["srun", f"--jobid={checked_job_id(run.job_id)}", "--overlap"]
        words += ["--ntasks-per-node=1"]
        if node:
            words += [f"--nodelist={checked_node(node)}", "--nodes=1", "--ntasks=1"]
        else:
            count = len(self.holding(run).nodes) or 1
            words += [f"--nodes={count}", f"--ntasks={count}"]
        words += ["--pty"] if pty else []
        return [*words, "--", *argv]
