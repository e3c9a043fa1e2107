"""``submit`` is schedule(render(spec)): write the run folder, queue the script, record the id.

A submission either leaves a complete run folder with a job id, or nothing at all.
"""

from __future__ import annotations

import shutil

from clustertrain import preflight, runs
from clustertrain.render import RenderedJob
from clustertrain.slurm import Slurm


def submit_job(job: RenderedJob, slurm: Slurm | None = None, check: bool = True) -> runs.Run:
    """Refuse a job the cluster cannot run (unless ``check`` is off), then queue it."""
    slurm = slurm or Slurm()
    if check:
        preflight.check(job.spec, slurm.cluster_info())
    path = runs.write_run_files(job)
    try:
        job_id = slurm.submit(job)
        return runs.record_submission(job, job_id)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
