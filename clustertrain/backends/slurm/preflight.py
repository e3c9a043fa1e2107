"""Refuse a job the cluster could never run, before it queues (pure: cluster facts in, verdict out).

Slurm itself accepts many impossible requests and leaves them PENDING forever (Reason=
PartitionNodeLimit, or worse, Resources); a user learns hours later. The facts come from
``sinfo`` and ``scontrol show partition`` (see ``Slurm.cluster_info``).
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from clustertrain.errors import UserError
from clustertrain.render import RenderedJob, container, render
from clustertrain.spec import JobSpec, resources, sweep
from clustertrain.spec.fields import format_time, time_seconds
from clustertrain.spec.resources import memory_mb

from .cluster_info import ClusterInfo, Node, Partition

_SKIP = " (or skip this check with --no-preflight)"


def check(spec: JobSpec, cluster: ClusterInfo) -> None:
    """Raise :class:`UserError` naming the first limit ``spec`` exceeds."""
    skip = _SKIP
    count = len(sweep.tasks(spec.sweep))
    if cluster.max_array_size is not None and count > cluster.max_array_size:
        raise UserError(
            f"sweep: {count} tasks exceed this site's MaxArraySize={cluster.max_array_size}; "
            f"sweep fewer values, or split it into several submissions{skip}"
        )
    runtime = spec.container_runtime
    if (
        runtime
        and cluster.container_runtimes is not None
        and runtime not in cluster.container_runtimes
    ):
        why = dict(cluster.missing_runtimes).get(runtime, "not found")
        offered = ", ".join(sorted(cluster.container_runtimes)) or "none"
        raise UserError(
            f"container_runtime: {runtime} is not installed on this cluster ({why}); "
            f"runtimes here: {offered}{skip}"
        )
    part = cluster.partition(spec.partition)
    names = ", ".join(p.name for p in cluster.partitions) or "none"
    if part is None:
        what = f"{spec.partition!r} does not exist" if spec.partition else "no default partition"
        raise UserError(f"partition: {what}; partitions here: {names}{skip}")
    if part.state != "UP":
        raise UserError(
            f"partition: {part.name} is {part.state}, not UP; try another of: {names}{skip}"
        )
    if part.max_nodes is not None and spec.allocated_nodes > part.max_nodes:
        raise UserError(
            f"{_nodes_field(spec)}: {_nodes_text(spec)} exceeds partition {part.name}'s MaxNodes="
            f"{part.max_nodes}; ask for fewer nodes{skip}"
        )
    wanted_s = time_seconds(spec.time) or 0
    if part.max_time_s is not None and wanted_s > part.max_time_s:
        raise UserError(
            f"time: {spec.time} exceeds partition {part.name}'s MaxTime="
            f"{format_time(part.max_time_s)}; ask for less time{skip}"
        )
    _check_nodes(spec, cluster, part)


def fit(job: RenderedJob, cluster: ClusterInfo) -> RenderedJob:
    """``job`` with a CPU request it left to clustertrain (the default, 4 per GPU) cut to what
    the partition's usable nodes with its GPUs have (:func:`clustertrain.spec.resources.fitted`),
    rendered again, its origins saying so; ``job`` itself where nothing needs fitting."""
    spec = job.spec
    part = cluster.partition(spec.partition)
    if part is None:
        return job  # check says why
    members = [
        n.cpus
        for n in _members(cluster, part)
        if n.gpus >= spec.gpus_per_node and n.name not in spec.exclude
    ]
    found = resources.fitted(spec, members)
    if found is None:
        return job
    if found.field == "cpus_per_gpu":
        fitted = dataclasses.replace(spec, cpus_per_gpu=found.value)
    else:
        fitted = dataclasses.replace(spec, cpus_per_task=found.value)
    per = f" for {spec.gpus_per_node} GPUs" if spec.gpus_per_node else ""
    note = (
        f"fitted to partition {part.name}, whose nodes have {found.node_cpus} CPUs{per}; "
        f"{resources.default_note(spec)}"
    )
    origins = tuple((n, w) for n, w in job.origins if n != found.field) + ((found.field, note),)
    again = render(fitted, job.run_dir, job.workdir)
    return dataclasses.replace(again, excluded=job.excluded, origins=origins)


def _members(cluster: ClusterInfo, part: Partition) -> list[Node]:
    return [n for n in cluster.nodes if part.name in n.partitions and n.usable]


def _check_nodes(spec: JobSpec, cluster: ClusterInfo, part: Partition) -> None:
    """The partition's usable nodes: enough of them, each with the GPUs, CPUs and memory."""
    skip = _SKIP
    members = _members(cluster, part)
    mem_field, wanted_mb = _memory(spec)
    cpus = spec.cpus
    limits = [
        ("gpus_per_node", spec.gpus_per_node, lambda n: n.gpus, "GPUs"),
        (cpus.field, cpus.per_node, lambda n: n.cpus, "CPUs"),
        (mem_field, wanted_mb, lambda n: n.memory_mb, "MB of memory"),
    ]
    for field, wanted, have, unit in limits:
        most = max((have(n) for n in members), default=0)
        if wanted > most:
            raise UserError(
                f"{field}: {_asked(spec, field, wanted)} {unit} per node requested but the "
                f"usable nodes of partition {part.name} have at most {most}: "
                f"{_fix(spec, field, most)}{skip}"
            )
    fitting = [n for n in members if all(have(n) >= wanted for _, wanted, have, _ in limits)]
    kept = [n for n in fitting if n.name not in spec.exclude]
    if spec.allocated_nodes > len(kept) and len(kept) < len(fitting):
        raise UserError(
            f"exclude: {_nodes_text(spec)} node(s) requested but only {len(kept)} of partition "
            f"{part.name}'s {len(fitting)} usable node(s) are not excluded "
            f"({','.join(n.name for n in fitting if n.name in spec.exclude)}: the job's exclude "
            "or your node record); `clustertrain nodes clear NODE`, or --no-avoid-bad-nodes"
            f"{skip}"
        )
    if spec.allocated_nodes > len(fitting):
        raise UserError(
            f"{_nodes_field(spec)}: {_nodes_text(spec)} requested but partition {part.name} "
            f"has only {len(fitting)} usable node(s) that can each give {spec.gpus_per_node} "
            f"GPU(s), {cpus.per_node} CPU(s) and {wanted_mb} MB{skip}"
        )


def _nodes_field(spec: JobSpec) -> str:
    return "spare_nodes" if spec.spare_nodes else "nodes"


def _nodes_text(spec: JobSpec) -> str:
    """``2``, or with spares ``3 (2 nodes + 1 spare)``."""
    if not spec.spare_nodes:
        return str(spec.nodes)
    return f"{spec.allocated_nodes} ({spec.nodes} nodes + {spec.spare_nodes} spare)"


def _memory(spec: JobSpec) -> tuple[str, int]:
    """The memory field the job gave and its MB per node (0: the cluster's default)."""
    if spec.mem_per_gpu:
        return "mem_per_gpu", memory_mb(spec.mem_per_gpu) * spec.gpus_per_node
    return "mem", memory_mb(spec.mem) if spec.mem else 0


def _asked(spec: JobSpec, field: str, per_node: int) -> str:
    """A per-GPU request said with what it makes per node: ``4 per GPU x 2 GPUs = 8``."""
    if field in resources.PER_GPU:
        per_gpu = per_node // max(1, spec.gpus_per_node)
        return f"{per_gpu} per GPU x {spec.gpus_per_node} GPUs = {per_node}"
    return str(per_node)


def _fix(spec: JobSpec, field: str, most: int) -> str:
    """What to ask instead: the flag and the most that fits (per GPU: the node's share)."""
    flag = "--" + field.replace("_", "-")
    if field in resources.PER_GPU:
        share = most // max(1, spec.gpus_per_node)
        if share < 1:  # fewer CPUs than GPUs: the node's CPUs, per node
            return f"ask --cpus-per-task {most} or fewer instead"
        return f"ask {flag} {share}{'' if field == 'cpus_per_gpu' else 'M'} or fewer"
    return f"ask for {most} or fewer"


def check_files(job: RenderedJob) -> None:
    """The files a container job needs, as this host sees them (the nodes are taken to share
    them): each mount's source, and an OCI image's root filesystem folder with the mount
    points the job needs (the image is mounted read-only, so runc cannot create them). The
    one check here that reads files."""
    spec = job.spec
    for mount in container.user_mounts(spec):
        if not Path(mount.source).exists():
            raise UserError(
                f"container_mounts: {mount.source} does not exist here; mount a folder the "
                "nodes have (the same paths as this host's)"
            )
    if spec.container_runtime != "oci" or spec.container_image is None:
        return
    image = spec.container_image
    if not Path(image).is_dir():
        raise UserError(
            f"container_image: {image} is not a folder here; give the root filesystem of an "
            "image (e.g. one made by scripts/build-oci-image) on a filesystem the nodes share"
        )
    missing = container.missing_mount_points(spec, job.run_dir, job.workdir, image)
    if missing:
        quoted = {path: shlex.quote(image.rstrip("/") + path) for path in missing}
        files = [quoted[path] for path in missing if path in container.NODE_FILES]
        folders = [quoted[path] for path in missing if path not in container.NODE_FILES]
        fixes = [f"mkdir -p {' '.join(folders)}"] if folders else []
        fixes += [f"touch {' '.join(files)}"] if files else []
        raise UserError(
            f"container_image: {image} lacks {', '.join(missing)}, where the job mounts the "
            "node's hosts and resolv.conf, the working directory, the run folder or "
            "container_mounts; "
            f"nothing can be created in a read-only image: create them once ({'; '.join(fixes)})"
            ", or work under /tmp"
        )
