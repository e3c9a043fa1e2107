"""The spec's fields said back as flags (clustertrain.spec.flags), as ``submit(host=...)`` hands
them to the login node: the CLI's own parser must read every field back to the same value."""

from __future__ import annotations

from typing import Any

import pytest

from clustertrain.cli.commands import submit as submit_command
from clustertrain.cli.options import SPEC_FLAGS, spec_fields
from clustertrain.errors import FieldError
from clustertrain.spec.flags import as_flags
from tests.conftest import job_spec

# A value for every field with a flag, the awkward ones on purpose: a value that starts with
# '-', quotes and spaces inside a prepare command, '=' inside an env value.
SAMPLES: dict[str, Any] = {
    "name": "my job",
    "nodes": 3,
    "gpus_per_node": 2,
    "procs_per_node": 4,
    "gpus_as_gres": True,
    "cpus_per_task": 8,
    "cpus_per_gpu": None,  # not beside cpus_per_task: test_per_gpu_fields_read_back
    "time": "1-02:00:00",
    "launcher": "accelerate",
    "script": "train.py",
    "module": None,
    "metric": "val/loss",
    "metric_mode": "min",
    "prepare": [["python", "-c", "print('a b')"], ["sh", "-c", 'echo "$HOME" > x']],
    "offline": False,
    "env": {"A": "x=y", "NCCL_DEBUG": "-INFO"},
    "setup": ["module load cuda/12.1", "export A='x y' && echo \"$A\" # --nodes=9"],
    "node_setup": ["-x is a line too", "ulimit -n 65536"],
    "partition": "gpu",
    "account": "proj-1",
    "qos": "normal",
    "constraint": "a100&ib",
    "exclusive": True,
    "mem": "64G",
    "mem_per_gpu": None,  # not beside mem: test_per_gpu_fields_read_back
    "mail_type": "END,FAIL",
    "mail_user": "me@example.org",
    "dependency": "afterok:12",
    "sbatch_options": ["--reservation=maint", "--comment=-x"],
    "signal_lead_s": 300,
    "max_restarts": 2,
    "storm_restarts": 4,
    "max_requeues": 5,
    "requeue_on_node_failure": True,
    "spare_nodes": 1,
    "node_check": False,
    "qualify": True,
    "compute_threshold": 2.5,
    "link_threshold": 20,
    "on_flagged": "warn",
    "exclude": ["node3", "node4"],
    "straggler_threshold": 1.75,
    "straggler_action": "replace",
    "avoid_bad_nodes": False,
    "hang_timeout_s": 600,
    "hang_on_quiet": True,
    "rdzv_timeout_s": 900,
    "socket_ifname": "ib0,ib1",
    "venv": "/opt/venv",
    "sweep": {"lr": ["0.1", "0.2"], "seed": [1, 2]},
    "max_parallel": 2,
    "container_image": "/images/root",
    "container_runtime": "oci",
    "container_mounts": ["/data:/data:ro"],
    "track": ["tensorboard", "mlflow"],
    "container_env": {"PATH": "/opt/conda/bin:/usr/bin"},
}


def _read_back(words: list[str]) -> dict[str, Any]:
    """``words`` as ``clustertrain submit`` reads them: the fields its flags give."""
    ctx = submit_command.make_context("submit", [*words, "--dry-run"])
    flags = {field.name: ctx.params[field.name] for field in SPEC_FLAGS}
    spec_fields(ctx, False, flags)
    return {name: value for name, value in flags.items() if value is not None}


def test_every_field_with_a_flag_has_a_sample() -> None:
    assert sorted(SAMPLES) == sorted(field.name for field in SPEC_FLAGS)


def test_every_field_reads_back_through_the_clis_parser_to_the_same_spec() -> None:
    given = {name: value for name, value in SAMPLES.items() if value is not None}
    words = as_flags(given)
    assert all(word.startswith("--") for word in words)  # each value inside its flag's word
    assert job_spec(**_read_back(words)) == job_spec(**given)


@pytest.mark.parametrize("name", [f.name for f in SPEC_FLAGS if SAMPLES[f.name] is not None])
def test_each_field_alone_reads_back_as_itself(name: str) -> None:
    base = {"container_image": "/images/root", "container_runtime": "oci"}
    given = {**(base if name.startswith("container_") else {}), name: SAMPLES[name]}
    if name == "max_parallel":
        given["sweep"] = SAMPLES["sweep"]
    assert job_spec(**_read_back(as_flags(given))) == job_spec(**given)


def test_per_gpu_fields_read_back() -> None:
    given = {"gpus_per_node": 4, "cpus_per_gpu": 6, "mem_per_gpu": "40G"}
    assert job_spec(**_read_back(as_flags(given))) == job_spec(**given)


def test_a_false_switch_is_said_as_its_no_flag() -> None:
    assert as_flags({"offline": False, "node_check": True}) == ["--no-offline", "--node-check"]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"nodes": 0}, "nodes"),  # the field's own check, here
        ({"env": {}}, "env"),  # an empty list of flags would read as "not given"
        ({"sweep": {"tag": ["a,b"]}}, "sweep.tag"),  # ',' separates a flag's values
        ({"args": ["--epochs", "1"]}, "args"),  # args follow --, they have no flag
        ({"no_such_field": 1}, "no_such_field"),
    ],
)
def test_what_no_flag_can_say_is_refused_naming_the_field(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(FieldError) as refused:
        as_flags(fields)
    assert str(refused.value).startswith(f"{named}: ")
