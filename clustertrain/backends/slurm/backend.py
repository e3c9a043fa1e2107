"""``SlurmBackend``: a Slurm cluster behind clustertrain's one backend interface; its checks are
preflight's (the cluster's limits) and the files the job names."""

from __future__ import annotations

from clustertrain.backends.base import Backend
from clustertrain.jobstate import JOB_IDS, JobState
from clustertrain.render import RenderedJob
from clustertrain.runs import Run

from . import preflight as preflight_checks
from .commands import Slurm


class SlurmBackend(Backend):
    """A Slurm cluster, through its commands (:class:`Slurm`); preflight reads its limits."""

    name = "slurm"
    job_ids = JOB_IDS[name]
    accepted = "queued"

    @staticmethod
    def cancel_command(job_id: str) -> str:
        return f"scancel {job_id}"

    def __init__(self, slurm: Slurm | None = None) -> None:
        self.slurm = slurm or Slurm()

    def check(self, job: RenderedJob, preflight: bool = True) -> None:
        if preflight:
            preflight_checks.check(job.spec, self.slurm.cluster_info())
            preflight_checks.check_files(job)

    def submit(self, job: RenderedJob) -> str:
        return self.slurm.submit(job)

    def state(self, run: Run) -> JobState:
        return self.slurm.state(run.job_id)

    def cancel(self, run: Run) -> None:
        self.slurm.cancel(run.job_id)
