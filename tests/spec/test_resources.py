"""CPUs and memory per node or per GPU (clustertrain.spec.resources), and the layers a spec is
built from (clustertrain.spec.build): which value wins, which pair is never asked together,
where each value came from."""

from __future__ import annotations

from typing import Any

import pytest

from clustertrain.errors import FieldError
from clustertrain.spec import JobSpec, resources
from clustertrain.spec.build import Layer, Origins, build
from tests.conftest import job_spec

SITE = Layer("site defaults: della", {"partition": "gpu", "cpus_per_gpu": 8,
             "mem_per_gpu": "32G", "setup": ("module load cuda",)}, site=True)  # fmt: skip


def _build(*layers: Layer) -> tuple[JobSpec, Origins]:
    return build([*layers, Layer("flag", {"module": "m"}, unset_none=True)])


def test_a_later_layer_wins_and_its_per_node_value_replaces_a_per_gpu_one() -> None:
    job_file = Layer("job file", {"gpus_per_node": 2, "cpus_per_task": 12, "mem": "0"})
    spec, origins = _build(SITE, job_file)
    asked = (spec.cpus_per_task, spec.cpus_per_gpu, spec.mem, spec.mem_per_gpu)
    assert asked == (12, None, "0", None)
    assert spec.cpus.flag == "--cpus-per-task=12"
    assert origins["partition"] == ("site defaults: della",)
    assert origins["cpus_per_task"] == ("job file",) and "cpus_per_gpu" not in origins
    # And the other way round: a flag's per-GPU value replaces the job file's per-node one.
    flags = Layer("flag", {"cpus_per_gpu": 3}, unset_none=True)
    spec, origins = build([job_file, flags, Layer("flag", {"module": "m"})])
    assert spec.cpus.flag == "--cpus-per-gpu=3" and origins["cpus_per_gpu"] == ("flag",)


def test_setup_lines_add_up_site_first() -> None:
    spec, origins = _build(
        SITE,
        Layer("job file", {"gpus_per_node": 1, "setup": ["source /v/bin/activate"]}),
        Layer("flag", {"setup": ["export NCCL_DEBUG=INFO"], "node_setup": None}, unset_none=True),
    )
    assert spec.setup == (
        "module load cuda", "source /v/bin/activate", "export NCCL_DEBUG=INFO",
    )  # fmt: skip
    assert origins["setup"] == ("site defaults: della", "job file", "flag")


def test_a_sites_per_gpu_defaults_serve_only_jobs_with_gpus() -> None:
    spec, origins = _build(SITE, Layer("job file", {"gpus_per_node": 0}))
    assert spec.cpus_per_gpu is None and spec.mem_per_gpu is None
    assert "cpus_per_gpu" not in origins and spec.partition == "gpu"
    spec, _ = _build(SITE, Layer("job file", {"gpus_per_node": 4}))
    assert spec.cpus.flag == "--cpus-per-gpu=8" and spec.mem_per_gpu == "32G"
    # A job's own per-GPU value without GPUs is its mistake: refused.
    with pytest.raises(FieldError, match="^cpus_per_gpu: .*needs gpus_per_node"):
        job_spec(gpus_per_node=0, cpus_per_gpu=2)


@pytest.mark.parametrize(
    "layer",
    [
        {"cpus_per_task": 4, "cpus_per_gpu": 2},
        {"mem": "64G", "mem_per_gpu": "8G"},
        {"script": "t.py", "module": "m"},
    ],
)
def test_one_layer_never_gives_both_of_a_pair(layer: dict[str, object]) -> None:
    with pytest.raises(FieldError, match=r"give either (\w+) or (\w+), not both"):
        build([Layer("job file", {"gpus_per_node": 1, **layer})])


@pytest.mark.parametrize(
    ("value", "ok"),
    [("32G", True), ("512", True), ("1M", True), ("64T", True), ("1024K", True),
     ("65T", False), ("0", False), ("0G", False), ("012G", False), ("12XB", False),
     ("-4G", False), ("4g", False), ("4 G", False), ("", False), (8, False), (True, False)],
)  # fmt: skip
def test_mem_per_gpu_is_a_size_from_1m_to_64t(value: object, ok: bool) -> None:
    if ok:
        assert resources.mem_per_gpu("mem_per_gpu", value) == value
    else:
        with pytest.raises(FieldError, match="^mem_per_gpu: "):
            resources.mem_per_gpu("mem_per_gpu", value)


@pytest.mark.parametrize(
    ("fields", "node_cpus", "fit"),
    [
        ({"gpus_per_node": 2}, [2, 2], ("cpus_per_gpu", 1, 2)),  # the local cluster's nodes
        ({"gpus_per_node": 8}, [128], None),  # 4 per GPU fit
        ({"gpus_per_node": 4, "nodes": 2}, [64, 12], ("cpus_per_gpu", 3, 12)),  # the worse
        ({"gpus_per_node": 4, "nodes": 1}, [64, 12], None),  # one node: the best
        ({"gpus_per_node": 4}, [2], ("cpus_per_gpu", 1, 2)),  # still too many: preflight's
        ({"procs_per_node": 4}, [6], ("cpus_per_task", 6, 6)),  # without GPUs
        ({"gpus_per_node": 2, "cpus_per_gpu": 4}, [2], None),  # given: never changed
        ({"gpus_per_node": 2, "cpus_per_task": 8}, [2], None),
        ({"gpus_per_node": 2}, [], None),  # no node to fit to
    ],
)
def test_a_default_cpu_request_is_fitted_to_the_nodes(
    fields: dict[str, Any], node_cpus: list[int], fit: tuple[str, int, int] | None
) -> None:
    assert resources.fitted(job_spec(**fields), node_cpus) == fit


def test_the_dry_run_names_a_default_cpu_request() -> None:
    assert resources.default_note(job_spec(gpus_per_node=2)) == (
        "default: 4 per GPU; a submission fits it to the partition's nodes"
    )
    assert "2 per process, at least 4" in str(resources.default_note(job_spec()))
    assert resources.default_note(job_spec(cpus_per_task=2)) is None
