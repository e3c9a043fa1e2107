"""The Python API: what the CLI does, for people who script their experiments.

Example::

    import clustertrain
    job = clustertrain.submit("jobs/mnist.yaml", nodes=2, extra_args=["--epochs", "1"])
    for line in job.logs(follow=True):    # every rank's lines until the job ends
        print(line)
    print(job.state, job.metrics()[-1])   # "COMPLETED", the closing record

    print(clustertrain.submit(nodes=4, gpus_per_node=8, dry_run=True).dry_run_text())
    job = clustertrain.Job.attach("42")   # a job submitted earlier, from the CLI or here

Fields are the job file's keys (``clustertrain.spec.FIELDS``), validated exactly as the CLI's
flags are; a bad value raises :class:`clustertrain.errors.FieldError`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustertrain import runs
from clustertrain.errors import UserError
from clustertrain.files import read_regular
from clustertrain.render import RenderedJob

if TYPE_CHECKING:
    from clustertrain.jobstate import JobState


def plan(
    job_file: str | None = None,
    *,
    extra_args: Sequence[str] = (),
    runs_dir: str | None = None,
    workdir: str | None = None,
    skip_prepare: bool = False,
    **fields: Any,
) -> RenderedJob:
    """The job as it would be submitted (the dry run): validated, rendered, nothing written.

    ``skip_prepare`` drops the job's prepare commands (``--no-prepare``)."""
    from clustertrain.errors import FieldError
    from clustertrain.render import render
    from clustertrain.spec import build_spec, jobfile

    if skip_prepare:
        if fields.get("prepare"):
            raise FieldError("prepare", fields["prepare"], "give it or skip it, not both")
        fields["prepare"] = []
    # The virtual environment this runs in, unless the job file or a field names one.
    defaults = {"venv": sys.prefix} if sys.prefix != sys.base_prefix else {}
    spec = build_spec(
        jobfile.load(job_file) if job_file else None,
        extra_args=extra_args,
        defaults=defaults,
        **fields,
    )
    run_dir = runs.new_run_dir(runs.runs_root(runs_dir), spec.name)
    return render(spec, str(run_dir), workdir or os.getcwd())


def submit(
    job_file: str | None = None,
    *,
    dry_run: bool = False,
    preflight: bool = True,
    extra_args: Sequence[str] = (),
    runs_dir: str | None = None,
    **fields: Any,
) -> Job | RenderedJob:
    """Validate, check against the partition (unless ``preflight=False``) and queue a job.

    With ``dry_run=True`` nothing is checked against Slurm, run or written: the rendered job
    comes back instead (``.batch_script``, ``.launch_script``, ``.dry_run_text()``). Otherwise
    the job's prepare commands run here first (see :mod:`clustertrain.backends.prepare`;
    ``skip_prepare=True`` skips them).
    """
    job = plan(job_file, extra_args=extra_args, runs_dir=runs_dir, **fields)
    if dry_run:
        return job
    from clustertrain.backends.submission import submit_job

    return Job(submit_job(job, check=preflight))


def run_local(
    job_file: str | None = None,
    *,
    extra_args: Sequence[str] = (),
    runs_dir: str | None = None,
    **fields: Any,
) -> Job:
    """Start the job on this machine without Slurm (see :mod:`clustertrain.backends.local`); returns
    at once. ``Job.wait()`` waits for it, ``Job.logs(follow=True)`` streams it."""
    from clustertrain import procs
    from clustertrain.backends import local, prepare

    job = plan(job_file, extra_args=extra_args, runs_dir=runs_dir, **fields)
    if job.spec.sweep:
        raise UserError("sweep: a local run is one job; submit a sweep to Slurm (job array)")
    if job.spec.container_image:
        raise UserError(
            f"container_image: a local run uses this machine's Python, not "
            f"{job.spec.container_image}; submit the job to Slurm to run it in the container"
        )
    with prepare.run(job.spec, job.workdir) as prepare_log:
        path = runs.write_run_files(job, prepare_log)
    supervisor = subprocess.Popen([sys.executable, "-m", "clustertrain.backends.local", str(path)])
    local.write_state(path, pid=supervisor.pid, start_time=procs.start_time(supervisor.pid))
    started = Job(runs.record_submission(job, f"local-{supervisor.pid}"))
    started._process = supervisor
    return started


class Job:
    """A submitted job, found through its run folder. Every property reads afresh."""

    def __init__(self, run: runs.Run) -> None:
        self.run = run
        self._process: subprocess.Popen[bytes] | None = None  # a local run started here

    @classmethod
    def attach(cls, ref: str, runs_dir: str | None = None) -> Job:
        """A job by id, run folder or ``"last"``, as the CLI's JOB argument."""
        return cls(runs.find_run(runs.runs_root(runs_dir), str(ref)))

    @property
    def job_id(self) -> str:
        return self.run.job_id

    @property
    def run_dir(self) -> Path:
        return self.run.path

    @property
    def state(self) -> str:
        """Slurm's state now, e.g. PENDING, RUNNING, COMPLETED, FAILED."""
        return self.job_state().state

    def job_state(self) -> JobState:
        """State, nodes, elapsed time and restarts, as Slurm reports them now."""
        from clustertrain.backends import local
        from clustertrain.backends.slurm import Slurm

        if local.is_local(self.job_id):
            if self._process is not None:
                self._process.poll()  # reaps it once it ended
            return local.state(self.run_dir, self.job_id)  # type: ignore[no-any-return]
        return Slurm().state(self.job_id)

    def wait(self, timeout: float | None = None, poll_s: float = 3.0) -> str:
        """Block until the job ends (or ``timeout`` seconds pass); return the state then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.job_state()
            if state.finished or (deadline is not None and time.monotonic() >= deadline):
                return str(state.state)
            left = poll_s if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(poll_s, left)))

    def logs(
        self,
        follow: bool = False,
        rank: int | None = None,
        node: str | None = None,
        raw: bool = False,
    ) -> Iterator[str]:
        """Every rank's lines, ``node1 rank0 | ...`` (only ``rank``'s or ``node``'s if given);
        with ``follow``, new ones as they come, until the job ends. What follows a failure is
        folded to a line per run unless ``raw``."""
        from clustertrain.runs import logs

        filters = logs.Filter(rank=rank, node=node, raw=raw)
        if follow:
            return logs.follow_lines(self.run, filters, self.job_state)
        return logs.read_all(self.run, filters)

    def cancel(self) -> None:
        from clustertrain.backends import local
        from clustertrain.backends.slurm import Slurm

        if local.is_local(self.job_id):
            local.cancel(self.run_dir, self.job_id)
        else:
            Slurm().cancel(self.job_id)

    def metrics(self) -> list[dict[str, Any]]:
        """The records of ``out/metrics.jsonl`` (one per epoch, then ``"event": "done"``)."""
        path = self.run.out_dir / "metrics.jsonl"
        if not path.exists():
            return []
        text = read_regular(path, 256 << 20).decode("utf-8", "replace")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, run_dir={str(self.run_dir)!r})"
