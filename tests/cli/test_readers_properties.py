"""Property tests over every reader a hostile value meets (issue 32): whatever bytes a job file,
a run folder's JSON, an events file, a node record, a remote record or a plan holds, the
reader returns a value of its own kind or refuses with its one-line error: never another
exception (a traceback for the user), never a hang. Hypothesis generates the values; the
named corpus is tests/cli/test_hostile_input.py and tests/cli/test_hostile_parsers.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from clustertrain import protocol
from clustertrain.backends import remote
from clustertrain.errors import FieldError, UserError
from clustertrain.files import RunFolderError, parse_json
from clustertrain.node.plan import Plan, PlanError
from clustertrain.rank import events
from clustertrain.runs import Run, read_run
from clustertrain.settings import noderecord
from clustertrain.spec import build_spec, jobfile

# derandomize: the same examples on every run, so that CI is not a lottery (a new example that
# fails is found by a run with derandomize=False and kept as a named case).
SETTINGS = settings(
    max_examples=150, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)  # fmt: skip
# JSON-like values, nested, with the awkward numbers and texts a forger would try.
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
)  # fmt: skip
VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=5),
    max_leaves=30,
)  # fmt: skip
# Bytes that are nearly JSON or YAML: real documents with noise, and raw bytes.
DOCUMENTS = st.one_of(
    st.binary(max_size=300),
    VALUES.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda a, b: a + b, VALUES.map(lambda v: json.dumps(v).encode()),
              st.binary(max_size=20)),
    st.sampled_from([b"[" * 100_000, b"1" * 5000, b"!!int 0x" + b"f" * 5000, b"&a [*a, *a]",
                     b"{? [a]: 1}", b"nodes: !!python/object/apply:os.system [id]"]),
)  # fmt: skip


@SETTINGS
@given(DOCUMENTS)
def test_json_from_a_run_folder_is_a_value_or_one_refusal(data: bytes) -> None:
    try:
        parse_json(data, "x")
    except RunFolderError as exc:
        assert "\n" not in str(exc)


@SETTINGS
@given(DOCUMENTS)
@example(b'{"!\\n"}')  # found by a random run: a key with a newline split the error's line
def test_a_job_file_is_a_spec_or_one_field_error(data: bytes) -> None:
    try:
        raw = jobfile.parse(data)
        build_spec(raw if isinstance(raw, dict) else None, module="pkg.train")
    except (FieldError, UserError) as exc:
        assert "\n" not in str(exc).strip()


@SETTINGS
@given(st.lists(st.one_of(VALUES, st.binary(max_size=80).map(lambda b: b.decode("latin-1"))),
                max_size=8))  # fmt: skip
def test_an_events_file_yields_only_well_formed_events(tmp_path: Path, lines: list[Any]) -> None:
    path = tmp_path / "events.jsonl"
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    path.write_text(text, encoding="utf-8", errors="replace")
    for event in events.read(path):
        assert event.name in events.NAMES and isinstance(event.time, float)
        for key, value in event.values.items():
            assert (
                isinstance(value, str)
                and len(value) <= 200
                or (protocol.METRIC_NAME.fullmatch(key) and isinstance(value, (int, float)))
            )


@SETTINGS
@given(DOCUMENTS)
def test_a_node_record_is_entries_of_node_names_or_one_refusal(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "default.json"
    path.write_bytes(data)
    try:
        record = noderecord.load(path)
    except UserError as exc:
        assert str(exc).startswith("node record: ") and "\n" not in str(exc)
        return
    assert all(protocol.NODE_NAME.fullmatch(e.node) for e in record.entries)
    assert all(protocol.NODE_NAME.fullmatch(node) for node in record.cleared)


@SETTINGS
@given(VALUES)
def test_a_node_record_of_any_shape_is_refused_unless_it_is_one(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "default.json"
    path.write_text(json.dumps({"entries": [value], "cleared": {}}))
    try:
        record = noderecord.load(path)
    except UserError:
        return
    assert all(protocol.NODE_NAME.fullmatch(e.node) for e in record.entries)


@SETTINGS
@given(DOCUMENTS)
def test_a_job_record_is_a_run_or_one_refusal(tmp_path: Path, data: bytes) -> None:
    (tmp_path / protocol.RECORD_FILE).write_bytes(data)
    try:
        run = read_run(tmp_path)
    except RunFolderError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(run, Run)


@SETTINGS
@given(DOCUMENTS)
def test_a_remote_record_is_a_checked_host_and_folder_or_one_refusal(
    tmp_path: Path, data: bytes
) -> None:
    (tmp_path / protocol.RECORD_FILE).write_text(json.dumps({}))
    (tmp_path / protocol.REMOTE_FILE).write_bytes(data)
    run = Run(tmp_path, "1", "x", "t", 1, 1, "torchrun")
    try:
        found = remote.of(run)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert found is None or not found.host.startswith("-")


@SETTINGS
@given(DOCUMENTS)
def test_a_plan_is_the_renderers_or_refused(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(data)
    try:
        Plan.read(path)
    except PlanError as exc:
        assert "\n" not in str(exc)
