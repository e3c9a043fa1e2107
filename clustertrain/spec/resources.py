"""What a job asks of each node besides its GPUs: CPUs and memory, per node or per GPU.

The launch is one task per node (torchrun or accelerate starts that node's processes), so
Slurm's ``--cpus-per-task`` is the CPUs of a whole node's share. A job with GPUs may ask per
GPU instead (``--cpus-per-gpu``, ``--mem-per-gpu``), which is what follows the GPUs when the
GPU count changes. Slurm refuses ``--cpus-per-gpu`` beside ``--cpus-per-task`` (sbatch(1):
"Not compatible with the --cpus-per-task option") and ``--mem-per-gpu`` beside ``--mem``, so a
job asks one of each pair, never both:

- ``cpus_per_task`` given: that many CPUs per node.
- ``cpus_per_gpu`` given (a job with GPUs): that many per GPU.
- neither, with GPUs: :data:`DEFAULT_CPUS_PER_GPU` per GPU (as SkyPilot's default); without
  GPUs: 2 per process, at least 4. A submission whose preflight reads the partition fits
  either default to its nodes (:func:`fitted`); a value you give is never changed.
- memory: the cluster's default unless ``mem`` (per node) or ``mem_per_gpu`` is given.

Pure functions: the spec checks a job with :func:`check`; the renderer asks :func:`cpu_request`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from clustertrain.errors import FieldError

if TYPE_CHECKING:
    from clustertrain.spec.job import JobSpec

DEFAULT_CPUS_PER_GPU = 4
# Sizes as Slurm writes them (default unit MB); at most 64 TiB for a GPU's share.
_SIZE = re.compile(r"([0-9]{1,12})([KMGT]?)")
_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}
_MAX_MB_PER_GPU = 64 * 1024**2
# Each pair: Slurm refuses the two together; a later layer's one replaces an earlier's other.
EXCLUSIVE = (("script", "module"), ("cpus_per_task", "cpus_per_gpu"), ("mem", "mem_per_gpu"))
_WHY = {
    "cpus_per_gpu": "Slurm refuses --cpus-per-gpu beside --cpus-per-task",
    "mem_per_gpu": "Slurm refuses --mem-per-gpu beside --mem",
}
PER_GPU = ("cpus_per_gpu", "mem_per_gpu")


def memory_mb(text: str) -> int:
    """Slurm's memory size (``--mem``, ``--mem-per-gpu``; default unit MB) in MB."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ValueError(text)
    return int(int(match[1]) * _MB[match[2]])


def mem_per_gpu(name: str, value: Any) -> str | None:
    """A size per GPU: digits and K, M, G or T, from 1M to 64T."""
    if value is None:
        return None
    valid = "must be a size per GPU like 32G (K, M, G or T; MB without one), from 1M to 64T"
    if not isinstance(value, str) or not _SIZE.fullmatch(value) or value.startswith("0"):
        raise FieldError(name, value, valid)
    if not 1 <= memory_mb(value) <= _MAX_MB_PER_GPU:
        raise FieldError(name, value, valid)
    return str(value)


def conflict(layer: dict[str, Any]) -> None:
    """Refuse one layer (a job file, the flags, a site's defaults) that gives both of a pair."""
    for first, second in EXCLUSIVE:
        if layer.get(first) is not None and layer.get(second) is not None:
            why = _WHY.get(second, "the job runs one of them")
            raise FieldError(
                second, layer[second], f"give either {first} or {second}, not both ({why})"
            )


def check(spec: JobSpec) -> None:
    """The rules between the fields: one of each pair, per-GPU values only with GPUs."""
    conflict({name: getattr(spec, name) for pair in EXCLUSIVE[1:] for name in pair})
    if not spec.gpus_per_node:
        for name, instead in zip(PER_GPU, ("cpus_per_task", "mem"), strict=True):
            if getattr(spec, name) is not None:
                raise FieldError(
                    name, getattr(spec, name),
                    f"needs gpus_per_node; for nodes without GPUs use {instead}",
                )  # fmt: skip


class CpuRequest(NamedTuple):
    """What Slurm is asked: ``--cpus-per-task=N`` or ``--cpus-per-gpu=N``, and the CPUs that
    makes on each node (the node's one task holds them all)."""

    option: str  # "cpus-per-task" or "cpus-per-gpu"
    value: int
    per_node: int

    @property
    def field(self) -> str:
        return self.option.replace("-", "_")

    @property
    def flag(self) -> str:
        return f"--{self.option}={self.value}"


def cpu_request(spec: JobSpec) -> CpuRequest:
    if spec.cpus_per_task is not None:
        return CpuRequest("cpus-per-task", spec.cpus_per_task, spec.cpus_per_task)
    gpus = spec.gpus_per_node
    if gpus:
        per_gpu = spec.cpus_per_gpu or DEFAULT_CPUS_PER_GPU
        return CpuRequest("cpus-per-gpu", per_gpu, per_gpu * gpus)
    default = default_cpus_per_task(spec.nproc_per_node)
    return CpuRequest("cpus-per-task", default, default)


def default_cpus_per_task(processes: int) -> int:
    """CPUs of a node without GPUs: 2 per process, at least 4 (8 ranks do not share 4 CPUs)."""
    return max(4, 2 * processes)


def defaulted(spec: JobSpec) -> bool:
    """Whether the job left its CPUs to clustertrain (neither field given)."""
    return spec.cpus_per_task is None and spec.cpus_per_gpu is None


class Fit(NamedTuple):
    """A defaulted CPU request cut to the nodes: the field, its value, the nodes' CPUs."""

    field: str
    value: int
    node_cpus: int


def fitted(spec: JobSpec, node_cpus: Sequence[int]) -> Fit | None:
    """A defaulted CPU request fitted to nodes of ``node_cpus`` CPUs each (the partition's
    usable nodes with the job's GPUs), or None where the default fits, the job gave its own,
    or there are no such nodes. The job gets the best of them, so the default is cut to what
    the worst of its share has: per GPU ``min(default, CPUs // GPUs)``, at least 1 (preflight
    then says what still cannot fit)."""
    if not defaulted(spec) or not node_cpus:
        return None
    best = sorted(node_cpus, reverse=True)
    have = best[min(spec.allocated_nodes, len(best)) - 1]
    if cpu_request(spec).per_node <= have:
        return None
    if spec.gpus_per_node:
        return Fit("cpus_per_gpu", max(1, have // spec.gpus_per_node), have)
    return Fit("cpus_per_task", max(1, have), have)


def default_note(spec: JobSpec) -> str | None:
    """Where a defaulted CPU request comes from, as the dry run says it."""
    if not defaulted(spec):
        return None
    rule = (
        f"{DEFAULT_CPUS_PER_GPU} per GPU"
        if spec.gpus_per_node
        else "2 per process, at least 4, without GPUs"
    )
    return f"default: {rule}; a submission fits it to the partition's nodes"
