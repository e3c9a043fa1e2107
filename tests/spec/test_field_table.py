"""The field table: every spec field declared once, its flag, help and default read from that
declaration, and every field's reader bounded (a very long value is one line, never a crash)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clustertrain.cli.options import SPEC_FLAGS
from clustertrain.errors import FieldError
from clustertrain.spec import FIELDS, VALIDATORS, JobSpec, build_spec
from clustertrain.spec.flags import flag_name, is_switch
from clustertrain.spec.jobfile import Plain
from tests.conftest import run_cli

# What a long value can be built of: digits (Python refuses to convert over 4,300 of them),
# letters, separators the checks split on, and what a shell or sbatch would read.
PIECES = ["9", "a", "-", ":", ",", "=", " ", "0x", "$", "'", '"', "\\", "%"]


def test_every_field_declares_its_check_and_help_once() -> None:
    assert list(VALIDATORS) == list(FIELDS)
    for field in dataclasses.fields(JobSpec):
        assert callable(field.metadata["check"]) and field.metadata["help"], field.name
        # A help text never retypes a default: the CLI adds it from the declaration.
        assert "default" not in field.metadata["help"].lower(), field.name


def _help_entries() -> dict[str, str]:
    """``submit --help`` as users read it: each option's first word and its whole help."""
    entries: dict[str, str] = {}
    flag = ""
    for line in run_cli("submit", "--help").stdout.splitlines():
        if line.startswith("  -"):
            first, _, text = line.strip().partition("  ")
            flag = first.split()[0].split("/")[0]
            entries[flag] = text.strip()
        elif flag and line.startswith(" " * 10) and line.strip():
            entries[flag] += " " + line.strip()
        elif not line.strip():
            flag = ""
    return entries


def test_every_field_but_args_has_a_flag_whose_help_states_the_fields_default() -> None:
    entries = _help_entries()
    assert sorted(f.name for f in SPEC_FLAGS) == sorted(set(FIELDS) - {"args"})
    for field in SPEC_FLAGS:
        flag = flag_name(field)
        stated = re.findall(r"\(default: (.*)\)$", entries[flag])
        expected = field.metadata["default_text"]
        if expected is None and is_switch(field):
            expected = "on" if field.default else "off"
        elif expected is None and field.default is not None and field.default != ():
            expected = str(field.default)
        assert stated == ([expected] if expected is not None else []), (flag, entries[flag])
    assert "default 120" not in " ".join(entries.values())  # the retyped default


@pytest.mark.parametrize("name", [f.name for f in SPEC_FLAGS])
def test_a_flag_with_a_very_long_value_is_one_line_and_exit_2(name: str) -> None:
    field = next(f for f in SPEC_FLAGS if f.name == name)
    flag = flag_name(field)
    value = "9" * 5000
    argv = [flag] if is_switch(field) else [flag, value]
    done = run_cli("submit", *argv, "--sweep", "x=1", "--dry-run")
    if is_switch(field):  # a switch takes no value: nothing long to read
        assert done.returncode in (0, 2), done.stderr
        return
    assert done.returncode == 2, (name, done.stdout[-300:], done.stderr[-300:])
    assert len(done.stderr.splitlines()) == 1 and len(done.stderr) < 600, done.stderr[-300:]
    assert "Traceback" not in done.stderr


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(FIELDS),
    parts=st.lists(st.sampled_from(PIECES), min_size=1, max_size=8),
    repeat=st.integers(min_value=1, max_value=6000),
    as_plain=st.booleans(),
)
def test_every_fields_reader_is_bounded(
    name: str, parts: list[str], repeat: int, as_plain: bool
) -> None:
    """Any value of any size is either taken or refused with a FieldError, and quickly."""
    text = "".join(parts) * repeat
    value: Any = Plain(text) if as_plain else text
    for shaped in (value, [value], {"K": value}, [[value]]):
        try:
            build_spec({name: shaped})
        except FieldError as exc:
            assert len(str(exc)) < 1000
