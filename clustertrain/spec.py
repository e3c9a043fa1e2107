"""The job spec: what a user asks for, from a YAML job file and command-line flags.

Everything a spec holds has been validated here, in one place, so the renderer can trust it.
Values are data: a field that reaches the shell is either restricted to what Slurm accepts or
quoted literally by the renderer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clustertrain import sweep
from clustertrain.errors import FieldError
from clustertrain.fields import VALIDATORS, ContainerRuntime, Launcher
from clustertrain.jobfile import Plain
from clustertrain.sweep import Sweep


@dataclass(frozen=True)
class JobSpec:
    """A validated multi-node training job. Build it with :func:`build_spec`."""

    name: str = "mnist"
    nodes: int = 1
    gpus_per_node: int = 0
    procs_per_node: int | None = None
    gpus_as_gres: bool = False
    # CPUs of each node's one task, shared by its processes. 0 (the default): 2 per process,
    # at least 4, resolved at construction, so 8 ranks of a node do not share 4 CPUs.
    cpus_per_task: int = 0
    time: str = "01:00:00"
    launcher: Launcher = "torchrun"
    # What each process runs: a script path, or a module run as `python -m` (one of the two).
    script: str | None = None
    module: str | None = "jobs.mnist.train"
    args: tuple[str, ...] = ()
    # Commands run on the submit host, in the submit directory, before anything is queued
    # (clustertrain.prepare): compute nodes often have no route out, login nodes do.
    prepare: tuple[tuple[str, ...], ...] = ()
    # Keep the usual tools off the network inside the job (render.OFFLINE_ENV).
    offline: bool = False
    env: tuple[tuple[str, str], ...] = ()
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    mem: str | None = None
    mail_type: str | None = None
    mail_user: str | None = None
    dependency: str | None = None
    sbatch_options: tuple[str, ...] = ()
    signal_lead_s: int = 120
    max_restarts: int = 0
    max_requeues: int = 3
    # A node lost mid-job: requeue (without it, from the last checkpoint) instead of ending.
    requeue_on_node_failure: bool = False
    node_check: bool = True
    rdzv_timeout_s: int = 120
    # The interface(s) gloo and NCCL use; None: each node's route to the head node decides.
    socket_ifname: str | None = None
    venv: str | None = None
    # A job array: each task this job with one combination of values (clustertrain.sweep).
    sweep: Sweep = ()
    max_parallel: int | None = None
    # The image the launcher and its ranks run in; the batch shell stays on the host
    # (clustertrain.container).
    container_image: str | None = None
    container_runtime: ContainerRuntime | None = None
    container_mounts: tuple[str, ...] = ()
    container_env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.max_parallel is not None and not self.sweep:
            raise FieldError("max_parallel", self.max_parallel, "only applies to a sweep")
        self._check_container()
        if self.cpus_per_task == 0:
            object.__setattr__(self, "cpus_per_task", max(4, 2 * self.nproc_per_node))

    def _check_container(self) -> None:
        if self.container_image is None:
            for name in ("container_runtime", "container_mounts", "container_env"):
                if getattr(self, name):
                    raise FieldError(name, getattr(self, name), "needs a container_image")
        elif self.container_runtime is None:
            raise FieldError(
                "container_runtime",
                None,
                "name the runtime that runs container_image: pyxis, apptainer or oci",
            )
        elif self.container_runtime == "oci" and not self.container_image.startswith("/"):
            raise FieldError(
                "container_image",
                self.container_image,
                "for oci, must be the absolute path of the image's root filesystem folder",
            )

    @property
    def threads_per_process(self) -> int:
        """OMP_NUM_THREADS for each rank: the task's CPUs split over the node's processes."""
        return max(1, self.cpus_per_task // self.nproc_per_node)

    @property
    def nproc_per_node(self) -> int:
        """Processes each node starts: one per GPU unless set, at least one on CPU-only nodes."""
        return self.procs_per_node or max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def entrypoint(self) -> tuple[str, ...]:
        """What follows the launcher's own options: ``SCRIPT`` or ``-m MODULE``."""
        return ("-m", self.module) if self.module is not None else (str(self.script),)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a job file would hold it (what a run folder records)."""
        data = {name: getattr(self, name) for name in FIELDS}
        data["args"] = list(self.args)
        data["prepare"] = [list(command) for command in self.prepare]
        data["env"] = dict(self.env)
        data["sbatch_options"] = list(self.sbatch_options)
        data["sweep"] = {name: list(values) for name, values in self.sweep}
        data["container_mounts"] = list(self.container_mounts)
        data["container_env"] = dict(self.container_env)
        return data


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(JobSpec))


def build_spec(
    job_file: Mapping[str, Any] | None = None,
    *,
    extra_args: Sequence[str] = (),
    defaults: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> JobSpec:
    """Merge ``defaults``, a job file's mapping and flag ``overrides`` (each later one wins), and
    validate every field. Raises :class:`FieldError` on the first bad field.

    ``None`` in overrides means "flag not given". ``env`` and ``sbatch_options`` are merged per
    key (a flag's ``A=2`` replaces the file's ``A=1``, and keeps its ``B``); ``args`` given as an
    override replace the file's, while ``extra_args`` (what follows ``--``) are appended to
    them, so the script's parser sees the later value last and lets it win.
    """
    merged: dict[str, Any] = {}
    for layer in (defaults or {}, _job_file_values(job_file), overrides):
        given = {name: value for name, value in layer.items() if value is not None}
        if "script" in given and "module" in given:
            raise FieldError("module", given["module"], "give either script or module, not both")
        for name, value in layer.items():
            if value is None and layer is overrides:
                continue
            checked = VALIDATORS[name](name, value)
            if isinstance(checked, Plain):  # a spec holds plain values (run folders dump them)
                checked = str(checked)
            merge = _MERGES.get(name)
            merged[name] = merge(merged[name], checked) if merge and name in merged else checked
            if name in _EITHER and checked is not None:
                merged[_EITHER[name]] = None  # a later layer's script replaces a module
    if extra_args:
        merged["args"] = merged.get("args", ()) + VALIDATORS["args"]("args", list(extra_args))
    return JobSpec(**merged)


def _job_file_values(job_file: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if job_file is None:
        return {}
    if not isinstance(job_file, Mapping):
        raise FieldError(
            "job file", type(job_file).__name__, "a job file must be a YAML mapping of field: value"
        )
    unknown = [key for key in job_file if key not in FIELDS]
    if unknown:
        key = min(unknown, key=str)
        raise FieldError(
            str(key), job_file[key], "unknown field; valid fields: " + ", ".join(FIELDS)
        )
    return job_file


def _merge_env(
    old: tuple[tuple[str, str], ...], new: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    return tuple({**dict(old), **dict(new)}.items())


def _merge_options(old: tuple[str, ...], new: tuple[str, ...]) -> tuple[str, ...]:
    by_name = {option.partition("=")[0]: option for option in old}
    by_name.update({option.partition("=")[0]: option for option in new})
    return tuple(by_name.values())


_MERGES: dict[str, Any] = {
    "env": _merge_env,
    "sbatch_options": _merge_options,
    "sweep": sweep.merge,
    "container_env": _merge_env,
}
_EITHER = {"script": "module", "module": "script"}
