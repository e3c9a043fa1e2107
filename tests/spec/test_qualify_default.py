"""Qualification by default with spare nodes: ``qualify`` left out is on with ``spare_nodes``,
off without; a job file's or a flag's true or false wins, in every layer. The spec holds a plain
bool, and the dry run says when the spares turned it on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clustertrain import api
from clustertrain.errors import FieldError
from clustertrain.spec.build import Layer, build
from clustertrain.spec.flags import as_flags
from clustertrain.spec.nodes import qualify_note
from tests.conftest import job_spec

ON = "qualification: on (spare_nodes: 1 asks for bad nodes to be swapped; "


def _spec(job_file: dict[str, Any], **flags: Any) -> Any:
    return job_spec({"module": "jobs.mnist.train", **job_file}, **flags)


@pytest.mark.parametrize(
    ("job_file", "flags", "qualified"),
    [
        ({}, {}, False),  # no spares: off
        ({"spare_nodes": 1}, {}, True),  # spares: on
        ({}, {"spare_nodes": 2}, True),  # spares from a flag: on
        ({"spare_nodes": 1}, {"qualify": False}, False),  # spares + --no-qualify: off
        ({"spare_nodes": 1, "qualify": False}, {}, False),  # spares + qualify: false: off
        ({}, {"qualify": True}, True),  # no spares + --qualify: on
        ({"qualify": True}, {}, True),  # no spares + qualify: true: on
        ({"spare_nodes": 1, "qualify": False}, {"qualify": True}, True),  # the flag wins
        ({"spare_nodes": 1, "qualify": None}, {"qualify": None}, True),  # null: left out
    ],
)
def test_qualify_left_out_follows_the_spare_nodes(
    job_file: dict[str, Any], flags: dict[str, Any], qualified: bool
) -> None:
    spec = _spec(job_file, **flags)
    assert spec.qualify is qualified  # a plain bool: nothing downstream sees "left out"
    assert spec.to_dict()["qualify"] is qualified


def test_a_sites_default_is_said_and_a_job_file_overrides_it() -> None:
    site = Layer("site defaults: della", {"qualify": False}, site=True)
    spec, origins = build([site, Layer("job file", {"module": "m", "spare_nodes": 1})])
    assert spec.qualify is False and origins["qualify"] == ("site defaults: della",)
    spec, _ = build([site, Layer("job file", {"module": "m", "spare_nodes": 1, "qualify": True})])
    assert spec.qualify is True


@pytest.mark.parametrize("value", ["maybe", "yes", 1, 0, "true", ["true"]])
def test_anything_but_true_false_or_nothing_is_refused_in_one_line(value: object) -> None:
    with pytest.raises(FieldError) as refused:
        _spec({"spare_nodes": 1, "qualify": value})
    said = str(refused.value)
    assert said.startswith("qualify: ") and "\n" not in said
    assert "must be true or false, or left out" in said


def test_a_recorded_spec_reads_back_as_it_was_decided() -> None:
    """A run folder records the decision (a local run builds its spec from it again)."""
    spec = _spec({"spare_nodes": 1}, qualify=False)
    assert job_spec(spec.to_dict()) == spec
    assert job_spec(_spec({"spare_nodes": 1}).to_dict()).qualify is True


def test_the_note_names_the_spares_only_when_they_decided() -> None:
    assert qualify_note(1, True, given=False) == (
        ON + "--no-qualify or qualify: false turns it off)"
    )
    assert qualify_note(1, True, given=True) is None  # the job said so: it reads it back
    assert qualify_note(1, False, given=True) is None
    assert qualify_note(0, False, given=False) is None  # nothing turned on


def test_the_python_api_leaves_none_to_the_spares(tmp_path: Path) -> None:
    runs = str(tmp_path / "runs")
    job = api.submit(module="m", spare_nodes=1, qualify=None, dry_run=True, runs_dir=runs)
    assert not isinstance(job, api.Job) and job is not None
    assert job.spec.qualify is True and json.loads(job.plan)["qualify"] is True
    assert job.dry_run_text().startswith("#### " + ON)
    off = api.plan(module="m", spare_nodes=1, qualify=False, runs_dir=runs)
    assert off.spec.qualify is False and off.notes == () and "qualify" not in json.loads(off.plan)
    on = api.plan(module="m", qualify=True, runs_dir=runs)
    assert on.spec.qualify is True and on.notes == ()
    assert not (tmp_path / "runs").exists()


def test_a_login_node_is_told_only_what_was_given() -> None:
    """``submit(host=...)`` says fields as flags: left out stays left out, for the login
    node's clustertrain to decide with the job file's spares."""
    assert as_flags({"qualify": None, "spare_nodes": 1}) == ["--spare-nodes=1"]
    assert as_flags({"qualify": False}) == ["--no-qualify"]
    assert as_flags({"qualify": True}) == ["--qualify"]
