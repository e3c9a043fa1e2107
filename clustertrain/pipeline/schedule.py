"""``submit`` is schedule(plan(...)): the backend's checks, the entry point's, the prepare
step, the run folder, the backend's submission, the recorded id, in that order.

Before the backend accepts the job, a failure leaves nothing behind. After it, the job is queued
(or running) and reads its scripts from the run folder: the folder is kept whatever happens, and
a failure to record the id says which job it was. A backend whose jobs a login node queues
(``queues_here`` false) is handed the job after its checks: that clustertrain does the rest.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from clustertrain import runs
from clustertrain.backends.base import Backend
from clustertrain.errors import UserError
from clustertrain.render import RenderedJob

from . import entrypoint, prepare


def schedule(
    job: RenderedJob,
    backend: Backend,
    check: bool = True,
    private: Mapping[str, bytes] | None = None,
) -> runs.Run:
    """Refuse what ``backend`` cannot run (its preflight and the entry point's too, unless
    ``check`` is off), run the job's prepare commands here, then hand it over with the
    ``private`` files (name: content, 0600) in its run folder. Checks come first: a refusal
    should not wait for a download. Where its preflight runs, the backend first fits what the
    job left to the cluster (the default CPU request, to a partition's nodes)."""
    if check:
        job = backend.fit(job)
    backend.check(job, preflight=check)
    if not backend.queues_here:
        return backend.record(job, backend.submit(job))
    if check:
        entrypoint.check(job.spec, job.workdir)
    with prepare.run(job.spec, job.workdir) as prepare_log:
        path = runs.write_run_files(job, prepare_log, private)
    try:
        job_id = backend.submit(job)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    try:
        return backend.record(job, job_id)
    except OSError as exc:
        raise UserError(
            f"job {job_id} is {backend.accepted}, but its id could not be recorded in {path} "
            f"({exc.strerror}); its scripts are kept there. Cancel it with "
            f"`{backend.cancel_command(job_id)}` or free space and follow it by id"
        ) from exc
