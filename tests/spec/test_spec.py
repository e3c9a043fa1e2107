"""The job spec: every field validated in one place, job files merged with flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clustertrain.errors import FieldError
from clustertrain.spec import FIELDS
from clustertrain.spec.jobfile import load as load_job_file
from tests.conftest import job_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "normalised"),
    [
        ("90", "01:30:00"),
        (90, "01:30:00"),
        ("30:00", "00:30:00"),
        ("01:30:00", "01:30:00"),
        ("2-00", "2-00:00:00"),
        ("1-12:30", "1-12:30:00"),
        ("1-00:00:05", "1-00:00:05"),
        ("100:00:00", "4-04:00:00"),
    ],
)
def test_time_formats_normalise(value: object, normalised: str) -> None:
    assert job_spec(time=value).time == normalised


@pytest.mark.parametrize(
    "value",
    [
        "25:99",
        "1:60:00",
        "1-24",
        "0",
        "abc",
        "",
        "1:2:3:4",
        "-5",
        "400-00",
        True,
        1.5,
        None.__class__.__name__,
    ],
)
def test_bad_times_name_the_field(value: object) -> None:
    with pytest.raises(FieldError) as caught:
        job_spec(time=value)
    assert str(caught.value).startswith("time: invalid value")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("nodes", 0),
        ("nodes", -1),
        ("nodes", "2"),
        ("nodes", True),
        ("nodes", 10**9),
        ("gpus_per_node", -1),
        ("cpus_per_task", 0),
        ("launcher", "mpirun"),
        ("name", "a\nb"),
        ("name", ""),
        ("name", "50%"),
        ("partition", "gpu;rm -rf /"),
        ("partition", "a b"),
        ("account", "$(id)"),
        ("mem", "lots"),
        ("dependency", "after:`id`"),
        ("mail_type", "SOMETIMES"),
        ("mail_user", "not-an-address"),
        ("env", {"1BAD": "x"}),
        ("env", {"A": ["list"]}),
        ("env", "A=b"),
        ("args", "--epochs 3"),
        ("args", [None]),
        ("sbatch_options", ["--nodes=3"]),
        ("sbatch_options", ["-N 3"]),
        ("sbatch_options", ["--x=a\nb"]),
        ("script", "--help"),
        ("module", "jobs/mnist/train.py"),
        ("module", "-c"),
        ("module", "os;system"),
        ("module", "a..b"),
        ("venv", "relative/venv"),
        ("exclusive", "yes"),
        ("signal_lead_s", 5),
        ("max_restarts", -1),
    ],
)
def test_bad_values_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(FieldError) as caught:
        job_spec(**{field: value})
    assert caught.value.field.split("[")[0].split(".")[0].split(" ")[0] == field
    assert "\n" not in str(caught.value)


def test_flags_override_the_job_file() -> None:
    spec = job_spec({"nodes": 2, "gpus_per_node": 2, "name": "from-file"}, nodes=4, name=None)
    assert (spec.nodes, spec.gpus_per_node, spec.name) == (4, 2, "from-file")


def test_unknown_keys_list_the_valid_ones() -> None:
    with pytest.raises(FieldError) as caught:
        job_spec({"nodez": 2})
    message = str(caught.value)
    assert message.startswith("nodez:") and all(field in message for field in FIELDS)


def test_a_job_file_must_be_a_mapping() -> None:
    with pytest.raises(FieldError, match="must be a YAML mapping"):
        job_spec(["nodes", 2])  # type: ignore[arg-type]


def test_world_size_is_one_process_per_gpu_or_per_node() -> None:
    assert job_spec(nodes=4, gpus_per_node=8).world_size == 32
    assert job_spec(nodes=3).world_size == 3
    assert job_spec(nodes=2, gpus_per_node=0, procs_per_node=4).world_size == 8


def test_env_accepts_a_mapping_or_key_value_flags() -> None:
    assert job_spec(env={"A": 1}).env == (("A", "1"),)
    assert job_spec(env=["A=x=y", "B="]).env == (("A", "x=y"), ("B", ""))


def test_shipped_job_files_are_valid() -> None:
    for path in sorted((ROOT / "jobs").glob("*.yaml")):
        spec = job_spec(load_job_file(str(path)))
        assert spec.script is None and spec.module == "jobs.mnist.train"
        assert (ROOT / "jobs" / "mnist" / "train.py").is_file()


def test_yaml_tags_that_build_objects_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "evil.yaml"
    bad.write_text("name: !!python/object/apply:os.system ['touch pwned']\n")
    with pytest.raises(FieldError, match="not valid YAML"):
        load_job_file(str(bad))
    assert not (tmp_path / "pwned").exists()


def test_a_job_file_of_unquoted_words_becomes_plain_values(tmp_path: Path) -> None:
    """Unquoted scalars are read as jobfile.Plain; the spec (and the run folder's YAML dump of
    it) must hold ordinary strings, or recording a submission fails after validation."""
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: x\npartition: debug\nqos: normal\nmem: 1G\naccount: proj\nmodule: pkg.train\n"
        "constraint: a100\nmail_type: END\ntime: 10\nlauncher: torchrun\n"
    )
    spec = job_spec(load_job_file(str(path)))
    values = spec.to_dict()
    assert all(type(v) is str for v in values.values() if isinstance(v, str)), values
    assert yaml.safe_load(yaml.safe_dump(values)) == values


@pytest.mark.parametrize(
    ("fields", "flag", "cpus", "threads"),
    [
        ({}, "--cpus-per-task=4", 4, 4),  # 1 process, no GPU: at least 4 CPUs
        ({"procs_per_node": 4}, "--cpus-per-task=8", 8, 2),  # 2 per process without GPUs
        ({"gpus_per_node": 8}, "--cpus-per-gpu=4", 32, 4),  # 4 per GPU
        ({"gpus_per_node": 2, "cpus_per_gpu": 3}, "--cpus-per-gpu=3", 6, 3),
        ({"gpus_per_node": 8, "cpus_per_task": 64}, "--cpus-per-task=64", 64, 8),  # it wins
        ({"procs_per_node": 3, "cpus_per_task": 2}, "--cpus-per-task=2", 2, 1),  # >= 1 thread
    ],
)
def test_the_cpu_request_and_threads_per_rank(
    fields: dict[str, int], flag: str, cpus: int, threads: int
) -> None:
    spec = job_spec(**fields)
    assert (spec.cpus.flag, spec.cpus.per_node, spec.threads_per_process) == (flag, cpus, threads)
    assert job_spec(spec.to_dict()) == spec  # what a run folder records reads back the same
