"""Property tests over every reader a hostile value meets (issue 32): whatever bytes a job file,
a run folder's JSON, an events file, a node record, a remote record or a plan holds, the
reader returns a value of its own kind or refuses with its one-line error: never another
exception (a traceback for the user), never a hang. Hypothesis generates the values; the
named corpus is tests/cli/test_hostile_input.py and tests/cli/test_hostile_parsers.py."""

from __future__ import annotations

import io
import itertools
import json
import tarfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from clustertrain import protocol
from clustertrain.backends import remote
from clustertrain.backends.remote import unpack
from clustertrain.errors import FieldError, UserError
from clustertrain.files import RunFolderError, parse_json, printable
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


# Issue 49: what a login node sends back, the lines clustertrain prints, the events a plot thins.
_NAMES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["a", "./a", "../a", "/etc/x", "a/../../b", "tasks/1/x", "job.json",
                     "./remote.json", "a\x1b]0;x\x07", ".", "./", "a//b", "x" * 300]),
)  # fmt: skip
_KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                          tarfile.CHRTYPE, tarfile.FIFOTYPE])  # fmt: skip


def _tar_of(members: list[tuple[str, bytes, bytes]]) -> bytes:
    made = io.BytesIO()
    with tarfile.open(fileobj=made, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, body in members:
            member = tarfile.TarInfo(name)
            member.type = kind
            member.size = len(body) if kind == tarfile.REGTYPE else 0
            member.linkname = "/etc/passwd" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
            tar.addfile(member, io.BytesIO(body) if member.size else None)
    return made.getvalue()


@SETTINGS
@given(st.one_of(
    st.lists(st.tuples(_NAMES, _KINDS, st.binary(max_size=20)), max_size=6).map(_tar_of),
    st.binary(max_size=600),
))  # fmt: skip
def test_a_tar_from_a_login_node_is_plain_files_inside_or_refused_whole(
    tmp_path_factory: Any, data: bytes
) -> None:
    top = tmp_path_factory.mktemp("unpack")
    here = top / "run"
    here.mkdir()
    (here / protocol.RECORD_FILE).write_text("mine")
    try:
        unpack.unpack(data, here)
    except UserError as exc:
        assert "\n" not in str(exc)
        assert [p.name for p in here.iterdir()] == [protocol.RECORD_FILE]  # nothing written
    assert (here / protocol.RECORD_FILE).read_text() == "mine"
    assert [p.name for p in top.iterdir()] == ["run"]  # nothing outside the run folder
    for path in here.rglob("*"):
        assert not path.is_symlink() and (path.is_dir() or path.is_file())
        assert path.name.isprintable() and not path.name.startswith(".unpack-")


@SETTINGS
@given(st.text())
def test_printed_text_has_no_control_character_but_tabs(text: str) -> None:
    shown = printable(text)
    assert all(c.isprintable() or c == "\t" for c in shown)
    assert printable(shown) == shown  # escaping twice changes nothing


@SETTINGS
@given(st.lists(st.sampled_from(["metrics", "step", "checkpoint", "restarted", "ended"]),
                max_size=300), st.integers(min_value=1, max_value=20))  # fmt: skip
def test_thinning_keeps_the_file_order_every_other_event_and_the_last(
    tmp_path_factory: Any, names: list[str], most: int
) -> None:
    path = tmp_path_factory.mktemp("events") / "events.jsonl"
    path.write_text("".join(
        json.dumps({"time": float(i), "event": name, "attempt": 0, "step": i}) + "\n"
        for i, name in enumerate(names)
    ))  # fmt: skip
    every = events.read(path)
    kept = events.scan(path, most=most)[0]
    assert [e.time for e in kept] == sorted(e.time for e in kept)  # file order
    assert {e.time for e in kept} <= {e.time for e in every}
    others = [e for e in every if e.name not in ("metrics", "step")]
    assert [e for e in kept if e.name not in ("metrics", "step")] == others
    if every:
        assert kept[-1] == every[-1]
    for before, after in itertools.pairwise(every):  # the first progress after another event
        if before.name not in ("metrics", "step") and after.name in ("metrics", "step"):
            assert after in kept
    for name in ("metrics", "step"):
        assert sum(e.name == name for e in kept) <= 2 * most + len(others) + 2 or not names
