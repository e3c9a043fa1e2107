"""The dry run: your site's defaults (clustertrain.settings.site), a job file, flags and fields
become a validated spec (clustertrain.spec), the nodes of your node record are excluded
(clustertrain.settings.noderecord), and the spec is rendered into the exact scripts Slurm would
run (clustertrain.render), with where each value came from. Nothing is written, neither torch
nor submitit imported."""

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
from clustertrain.spec import JobSpec, jobfile, nodes, resources
from clustertrain.spec.build import Layer, Origins, build, job_file_values


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
    (a Slurm job's; a local run's is not), your site's defaults are the lowest layer of the job
    (:mod:`clustertrain.settings.site`) and the nodes your node record holds are excluded
    unless the job says ``avoid_bad_nodes: false`` (:mod:`clustertrain.settings.noderecord`)."""
    if skip_prepare:
        if fields.get("prepare"):
            raise FieldError("prepare", fields["prepare"], "give it or skip it, not both")
        fields["prepare"] = []
    if job_file is None and fields.get("script") is None and fields.get("module") is None:
        job_file = default_job_file()
    layers = _layers(jobfile.load(job_file) if job_file else None, fields, site=node_record)
    spec, origins = build(layers, extra_args)
    root = runs.runs_root(runs_dir)
    spec, excluded = _without_bad_nodes(spec, root) if node_record else (spec, ())
    job = render(spec, str(runs.new_run_dir(root, spec.name)), workdir or os.getcwd())
    note = nodes.qualify_note(spec.spare_nodes, spec.qualify, given="qualify" in origins)
    return dataclasses.replace(
        job, excluded=excluded, origins=_said(spec, origins), notes=(note,) if note else ()
    )


def _layers(job_file: Any, fields: dict[str, Any], site: bool) -> list[Layer]:
    """This environment's virtual environment, your site's defaults, the job file, the flags."""
    layers = []
    if sys.prefix != sys.base_prefix:  # unless the job file or a field names one
        layers.append(Layer("this environment", {"venv": sys.prefix}))
    if site:
        from clustertrain.settings import site as sites  # lazy: start-up time

        found = sites.defaults()
        if found is not None:
            layers.append(Layer(found.label, found.values, site=True))
    layers.append(Layer("job file", job_file_values(job_file)))
    return [*layers, Layer("flag", fields, unset_none=True)]


def _said(spec: JobSpec, origins: Origins) -> tuple[tuple[str, str], ...]:
    """Each given field's layers, and the CPU request clustertrain chose, as the dry run says
    them."""
    said = {name: " + ".join(labels) for name, labels in origins.items()}
    note = resources.default_note(spec)
    if note is not None:
        said[spec.cpus.field] = note
    return tuple(said.items())


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
