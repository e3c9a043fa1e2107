"""The dry run: a job file, flags and fields become a validated spec (clustertrain.spec), the
nodes of your node record are excluded (clustertrain.settings.noderecord), and the spec is
rendered into the exact scripts Slurm would run (clustertrain.render). Nothing is written,
neither torch nor submitit imported."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clustertrain import runs
from clustertrain.errors import FieldError
from clustertrain.render import RenderedJob, render
from clustertrain.spec import JobSpec, build_spec, jobfile


def plan(
    job_file: str | None = None,
    *,
    extra_args: Sequence[str] = (),
    runs_dir: str | None = None,
    workdir: str | None = None,
    skip_prepare: bool = False,
    node_record: bool = True,
    **fields: Any,
) -> RenderedJob:
    """The job as it would be submitted (the dry run): validated, rendered, nothing written.

    ``skip_prepare`` drops the job's prepare commands (``--no-prepare``). With ``node_record``
    (a Slurm job's), the nodes your node record holds are excluded unless the job says
    ``avoid_bad_nodes: false`` (:mod:`clustertrain.settings.noderecord`)."""
    if skip_prepare:
        if fields.get("prepare"):
            raise FieldError("prepare", fields["prepare"], "give it or skip it, not both")
        fields["prepare"] = []
    # The virtual environment this runs in, unless the job file or a field names one.
    defaults = {"venv": sys.prefix} if sys.prefix != sys.base_prefix else {}
    if job_file is None and fields.get("script") is None and fields.get("module") is None:
        job_file = default_job_file()
    spec = build_spec(
        jobfile.load(job_file) if job_file else None,
        extra_args=extra_args,
        defaults=defaults,
        **fields,
    )
    root = runs.runs_root(runs_dir)
    spec, excluded = _without_bad_nodes(spec, root) if node_record else (spec, ())
    job = render(spec, str(runs.new_run_dir(root, spec.name)), workdir or os.getcwd())
    return dataclasses.replace(job, excluded=excluded)


def _without_bad_nodes(spec: JobSpec, root: Path) -> tuple[JobSpec, tuple[str, ...]]:
    """``spec`` excluding the nodes your node record holds (unless it says ``avoid_bad_nodes:
    false``), and a line for each, saying why."""
    if not spec.avoid_bad_nodes:
        return spec, ()
    from clustertrain.settings import noderecord  # lazy: start-up time

    record = noderecord.read(noderecord.mine(), root)
    excluded = [e for e in record.entries if e.node not in spec.exclude]
    if excluded:
        spec = dataclasses.replace(spec, exclude=(*spec.exclude, *(e.node for e in excluded)))
    return spec, tuple(e.line() for e in excluded)


def default_job_file() -> str:
    """The job of a submission that names no job file, script or module: the MNIST example's
    job file, installed with clustertrain (the top-level ``jobs/`` is in the wheel), so that
    ``clustertrain submit --nodes 2`` runs the same job from a clone and from an install."""
    from importlib.resources import files  # lazy: start-up time, only without a job file

    return str(files("jobs") / "mnist.yaml")
