"""Sweeps: one Slurm job array whose tasks are the product of every swept value.

``--sweep lr=0.1,0.2,0.4 --sweep seed=1,2`` (or ``sweep: {lr: [0.1, 0.2, 0.4], seed: [1, 2]}``
in a job file) makes 6 tasks, numbered in product order (the last name varies fastest); task
K passes ``--lr V --seed W`` to the training script after its other arguments. Each task is a
whole multi-node job with its own folder ``tasks/K/`` (``logs/``, ``out/``, ``events.jsonl``),
its own rendezvous (from its own job id) and its own requeues. The run folder's table of them
(``sweep.json``) and the tasks' folders are clustertrain.runs.sweeps'.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from typing import Any

from clustertrain.errors import FieldError
from clustertrain.spec.jobfile import flag_mapping

Sweep = tuple[tuple[str, tuple[str, ...]], ...]
MAX_TASKS = 10_000
# The script's option name: --NAME.
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_MAX_VALUE = 256


def parse(field: str, value: Any) -> Sweep:
    """A job file's mapping ``{name: [values]}`` or the flags' ``["name=v1,v2", ...]``."""
    if isinstance(value, list | tuple):
        names = [str(item).partition("=")[0] for item in value]
        twice = next((name for name in names if names.count(name) > 1), None)
        if twice is not None:
            raise FieldError(
                field, twice, f"is swept twice; give its values once, e.g. --sweep {twice}=1,2,3"
            )
        flags = flag_mapping(field, value, "--sweep lr=0.1,0.2")
        value = {name: values.split(",") for name, values in flags.items()}
    if not isinstance(value, Mapping):
        raise FieldError(field, value, "must be a mapping of name: [values], e.g. lr: [0.1, 0.2]")
    checked = tuple(
        (_name(field, name), _values(f"{field}.{name}", v)) for name, v in value.items()
    )
    total = math.prod(len(values) for _, values in checked)
    if total > MAX_TASKS:
        raise FieldError(field, total, f"makes {total} tasks; sweep at most {MAX_TASKS}")
    return checked


def _name(field: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise FieldError(f"{field} name", name, "must be an option name like lr or warmup-steps")
    return name


def _values(field: str, values: Any) -> tuple[str, ...]:
    if not isinstance(values, list | tuple):
        values = [values]
    if len(values) > MAX_TASKS:  # counted before anything is checked or expanded
        raise FieldError(field, len(values), f"is {len(values)} values; sweep at most {MAX_TASKS}")
    texts: list[str] = []
    seen: set[str] = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise FieldError(field, value, "must be a number or a word")
        text = str(value)
        if not text or len(text) > _MAX_VALUE or not text.isprintable():
            raise FieldError(field, text, f"must be 1 to {_MAX_VALUE} printable characters")
        if text in seen:
            raise FieldError(field, text, "is given twice; give each value once")
        seen.add(text)
        texts.append(text)
    if not texts:
        raise FieldError(field, "", "is empty; give at least one value, e.g. lr=0.1,0.2")
    return tuple(texts)


def merge(old: Sweep, new: Sweep) -> Sweep:
    """A later layer's values for a name replace the earlier ones; other names stay."""
    return tuple({**dict(old), **dict(new)}.items())


def tasks(sweep: Sweep) -> list[dict[str, str]]:
    """Each task's parameters, in task order; none without a sweep."""
    if not sweep:
        return []
    names = [name for name, _ in sweep]
    return [
        dict(zip(names, combo, strict=True)) for combo in itertools.product(*(v for _, v in sweep))
    ]


def task_args(params: Mapping[str, str]) -> list[str]:
    return [word for name, value in params.items() for word in (f"--{name}", value)]


def describe(params: Mapping[str, str]) -> str:
    return " ".join(f"{name}={value}" for name, value in params.items())
