"""Preflight refuses what a partition could never run, naming the limit."""

from __future__ import annotations

import pytest

from clustertrain.backends.slurm import parse_nodes, parse_partitions
from clustertrain.backends.slurm.cluster_info import ClusterInfo, gpu_count
from clustertrain.backends.slurm.preflight import check as check_spec
from clustertrain.backends.slurm.preflight import fit, memory_mb
from clustertrain.errors import UserError
from clustertrain.render import RenderedJob, render
from clustertrain.spec import JobSpec
from tests.backends.test_slurm_parsing import PARTITIONS, SINFO
from tests.conftest import job_spec

CLUSTER = ClusterInfo("slurm 22.05", parse_partitions(PARTITIONS), parse_nodes(SINFO))


def fitted(spec: JobSpec, cluster: ClusterInfo) -> RenderedJob:
    return fit(render(spec, "/runs/x", "/work"), cluster)


def check(spec: JobSpec, cluster: ClusterInfo) -> None:
    """As a submission checks: its default CPU request fitted first."""
    check_spec(fitted(spec, cluster).spec, cluster)


@pytest.mark.parametrize(
    ("request_", "names"),
    [
        ({"nodes": 3}, "nodes: 3 requested but partition debug has only 2 usable"),
        ({"gpus_per_node": 5}, "gpus_per_node: 5 GPUs"),
        ({"cpus_per_task": 16}, "cpus_per_task: 16 CPUs"),  # the 16-CPU node is drained
        # A per-GPU request says what it makes per node, and what would fit.
        (
            {"gpus_per_node": 2, "cpus_per_gpu": 5},
            "cpus_per_gpu: 5 per GPU x 2 GPUs = 10 CPUs per node requested but the usable "
            "nodes of partition debug have at most 8: ask --cpus-per-gpu 4 or fewer",
        ),
        (
            {"gpus_per_node": 2, "mem_per_gpu": "4G"},
            "mem_per_gpu: 4096 per GPU x 2 GPUs = 8192 MB of memory per node requested but "
            "the usable nodes of partition debug have at most 4096: ask --mem-per-gpu 2048M",
        ),
        ({"mem": "5G"}, "mem: 5120 MB"),
        ({"partition": "nope"}, "partition: 'nope' does not exist; partitions here: debug, gpu"),
        ({"partition": "gpu"}, "partition: gpu is DOWN"),
        ({"nodes": 2, "gpus_per_node": 3}, "nodes: 2 requested but partition debug has only 1"),
        # Nodes the job (or your node record) excludes leave too few: said, naming them.
        (
            {"nodes": 2, "exclude": ["n2"]},
            "exclude: 2 node(s) requested but only 1 of partition "
            "debug's 2 usable node(s) are not excluded (n2: the job's exclude or your node record)",
        ),
        # Spares are nodes the job holds too.
        (
            {"nodes": 2, "spare_nodes": 1},
            "spare_nodes: 3 (2 nodes + 1 spare) requested but partition debug has only 2 usable",
        ),
    ],
)
def test_impossible_requests_are_refused(request_: dict[str, object], names: str) -> None:
    with pytest.raises(UserError) as caught:
        check(job_spec(**request_), CLUSTER)
    assert str(caught.value).startswith(names) and "--no-preflight" in str(caught.value)


def test_limits_of_the_partition() -> None:
    up = ClusterInfo(
        "x", parse_partitions(PARTITIONS.replace("State=DOWN", "State=UP")), parse_nodes(SINFO)
    )
    with pytest.raises(UserError, match="MaxNodes=2"):
        check(job_spec(partition="gpu", nodes=3), up)
    with pytest.raises(UserError, match=r"spare_nodes: 3 \(2 nodes \+ 1 spare\) exceeds"):
        check(job_spec(partition="gpu", nodes=2, spare_nodes=1), up)
    with pytest.raises(UserError, match="MaxTime=1-00:00:00"):
        check(job_spec(partition="gpu", time="2-00"), up)


def test_possible_requests_pass() -> None:
    check(job_spec(nodes=2, gpus_per_node=2, cpus_per_task=8, mem="4G"), CLUSTER)
    check(job_spec(nodes=1, gpus_per_node=4), CLUSTER)


def test_units() -> None:
    assert memory_mb("64G") == 65536 and memory_mb("512") == 512 and memory_mb("0") == 0
    assert gpu_count("gpu:a100:4(S:0-1),gpu:v100:2") == 6 and gpu_count("(null)") == 0


def test_a_sweep_larger_than_max_array_size_is_refused() -> None:
    import dataclasses

    site = dataclasses.replace(CLUSTER, max_array_size=4)
    check(job_spec(nodes=1, sweep=["lr=1,2", "seed=1,2"]), site)
    with pytest.raises(UserError, match=r"^sweep: 6 tasks exceed this site's MaxArraySize=4"):
        check(job_spec(nodes=1, sweep=["lr=1,2,3", "seed=1,2"]), site)


def test_a_default_cpu_request_is_fitted_to_the_partitions_nodes() -> None:
    """4 per GPU where 8 CPUs hold 4 GPUs: 2 per GPU, and the dry run's origins say so; a
    request the job gave is never changed (preflight refuses it instead)."""
    job = fitted(job_spec(nodes=2, gpus_per_node=4), CLUSTER)
    assert job.spec.cpus_per_gpu == 2 and "--cpus-per-gpu=2" in job.directives
    assert '"--cpus-per-gpu=2"' in job.plan and "--cpus-per-gpu=4" not in job.batch_script
    said = dict(job.origins)["cpus_per_gpu"]
    assert said.startswith("fitted to partition debug, whose nodes have 8 CPUs for 4 GPUs")
    assert fitted(job_spec(gpus_per_node=1), CLUSTER).spec.cpus_per_gpu is None  # 4 fit
    given = job_spec(gpus_per_node=4, cpus_per_gpu=4)
    assert fitted(given, CLUSTER).spec == given
    # Without GPUs: 2 per process, at least 4, cut to the nodes' CPUs.
    many = fitted(job_spec(procs_per_node=8), CLUSTER).spec
    assert (many.cpus_per_task, many.cpus.per_node) == (8, 8)


def test_a_local_cluster_node_of_2_cpus_and_2_gpus_gets_1_cpu_per_gpu() -> None:
    small = ClusterInfo(
        "slurm 22.05",
        parse_partitions(PARTITIONS),
        parse_nodes("node1|debug*|2|4096|gpu:2|idle\nnode2|debug*|2|4096|gpu:2|idle\n"),
    )
    job = fitted(job_spec(nodes=2, gpus_per_node=2), small)
    assert "--cpus-per-gpu=1" in job.directives
    check_spec(job.spec, small)
    with pytest.raises(UserError, match=r"ask --cpus-per-gpu 1 or fewer \(or skip"):
        check_spec(job_spec(nodes=2, gpus_per_node=2, cpus_per_gpu=4), small)
