"""Each spec field's command-line flag: its name, and a checked value said back as flags.

The CLI builds its options from the same declarations (clustertrain.cli.options); the Python
API's ``submit(host=...)`` hands its fields to the login node's ``clustertrain submit`` as these
flags, so that a field reaches the other side by the one path the CLI's own flags take.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from typing import Any

from clustertrain.errors import FieldError
from clustertrain.spec.job import VALIDATORS, JobSpec

_FIELDS = {f.name: f for f in dataclasses.fields(JobSpec)}


def flag_name(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata["flag"] or "--" + field.name.replace("_", "-"))


def is_switch(field: dataclasses.Field[Any]) -> bool:
    """A true-or-false field: its flag is ``--NAME`` / ``--no-NAME``. Read from its type, not
    its default: ``qualify``'s default is None (left out), which the spec decides."""
    return str(field.type) == "bool"


def as_flags(overrides: Mapping[str, Any]) -> list[str]:
    """``overrides`` (fields as :func:`clustertrain.spec.build_spec` takes them, ``None`` for
    "not given") as flags a ``submit`` command line reads back to the same values.

    Each value is checked first, so a bad one is the field's own one-line error here; ``args``
    have no flag (they follow ``--``). Every flag is one word, ``--flag=VALUE``, so a value that
    starts with ``-`` can never be read as an option of its own."""
    words: list[str] = []
    for name, value in overrides.items():
        if name not in _FIELDS or name == "args":
            raise FieldError(
                name, value, "is not a field with a flag; see clustertrain.spec.FIELDS"
            )
        if value is not None:
            words += _said(_FIELDS[name], VALIDATORS[name](name, value))
    return words


def _said(field: dataclasses.Field[Any], checked: Any) -> list[str]:
    flag = flag_name(field)
    if is_switch(field):
        return [flag if checked else f"--no-{flag[2:]}"]
    if not isinstance(field.default, tuple):
        return [f"{flag}={checked}"]
    if not checked:  # an empty flag list is "not given": it cannot replace a job file's value
        raise FieldError(
            field.name,
            [],
            "cannot be sent empty over ssh; leave it out, or empty it in the job file",
        )
    return [f"{flag}={_item(field.name, item)}" for item in checked]


def _item(name: str, item: Any) -> str:
    """One repeated flag's value: ``KEY=VALUE`` pairs, a prepare command as a shell would split
    it back, a sweep's ``NAME=V1,V2``, or the word itself."""
    if name == "prepare":
        return shlex.join(item)
    if isinstance(item, str):
        return item
    key, value = item
    if isinstance(value, tuple):  # a sweep's values, which a flag separates by commas
        if any("," in v for v in value):
            raise FieldError(f"{name}.{key}", list(value), "a value with ',' cannot be a flag")
        value = ",".join(value)
    return f"{key}={value}"
