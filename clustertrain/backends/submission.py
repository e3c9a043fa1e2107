"""``submit`` is schedule(render(spec)): write the run folder, queue the script, record the id.

Before sbatch succeeds, a failure leaves nothing behind. After it, the job is queued and reads
its scripts from the run folder: the folder is kept whatever happens, and a failure to record
the id says which job it was.
"""

from __future__ import annotations

import shutil

from clustertrain import runs
from clustertrain.backends import preflight, prepare
from clustertrain.backends.slurm import Slurm
from clustertrain.errors import UserError
from clustertrain.render import RenderedJob


def submit_job(job: RenderedJob, slurm: Slurm | None = None, check: bool = True) -> runs.Run:
    """Refuse a job the cluster cannot run (unless ``check`` is off), run its prepare commands
    here, then queue it. Preflight comes first: a refusal should not wait for a download."""
    slurm = slurm or Slurm()
    if check:
        preflight.check(job.spec, slurm.cluster_info())
        preflight.check_files(job)
    with prepare.run(job.spec, job.workdir) as prepare_log:
        path = runs.write_run_files(job, prepare_log)
    try:
        job_id = slurm.submit(job)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    try:
        return runs.record_submission(job, job_id)
    except OSError as exc:
        raise UserError(
            f"job {job_id} is queued, but its id could not be recorded in {path} "
            f"({exc.strerror}); its scripts are kept there. Cancel it with `scancel {job_id}` "
            "or free space and follow it by id"
        ) from exc
