"""The checks of the fields about nodes: which a job must not get (``exclude``), whether they
are qualified (``qualify``), how much slower than the others a node may be
(``compute_threshold``, ``link_threshold``, ``straggler_threshold``) and what is done
then (``on_flagged``, ``straggler_action``). Each turns a value from a job file or a flag into
the spec's type, or raises :class:`FieldError` naming the field, the value and the fix.
"""

from __future__ import annotations

import re
from typing import Any

from clustertrain import protocol
from clustertrain.errors import FieldError


def node_names(name: str, value: Any) -> tuple[str, ...]:
    """Slurm node names, one each (``exclude``): never a range, an option or a list in one."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or len(items) > 1024:
        raise FieldError(name, value, "must be a list of Slurm node names like node3")
    for item in items:
        if not isinstance(item, str) or not protocol.NODE_NAME.fullmatch(item):
            raise FieldError(
                name, item, "must be one Slurm node name like node3 (no range, no option)"
            )
    return tuple(dict.fromkeys(items))


def qualify(name: str, value: Any) -> bool | None:
    """true, false, or None: left out, which :func:`qualifies` decides."""
    if value is not None and not isinstance(value, bool):
        raise FieldError(
            name, value, "must be true or false, or left out (then on with spare_nodes, else off)"
        )
    return value


def qualifies(qualify: bool | None, spare_nodes: int) -> bool:
    """Whether a job's nodes are qualified: as it says, else with spare nodes. A job that holds
    spares asks for bad nodes to be swapped, and only a qualification finds the node that is
    there and slow (a link at 10 Mbit trained on for 6 minutes instead of 1, unnamed)."""
    return spare_nodes > 0 if qualify is None else qualify


def qualify_note(spare_nodes: int, qualify: bool, given: bool) -> str | None:
    """The dry run's line when the spare nodes turned qualification on; None when the job said
    which it wants (it reads its own choice back), or nothing was turned on."""
    if given or not qualify:
        return None
    return (
        f"qualification: on (spare_nodes: {spare_nodes} asks for bad nodes to be swapped; "
        "--no-qualify or qualify: false turns it off)"
    )


def ratio(low: float, high: float) -> Any:
    """A number above ``low`` and at most ``high``, from a job file (``2``, ``1.5``) or a flag."""

    def check(name: str, value: Any) -> float:
        valid = f"must be a number above {low:g} and at most {high:g}, e.g. 2.0"
        if isinstance(value, str) and re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,6})?", value):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FieldError(name, value, valid)
        if not low < value <= high:
            raise FieldError(name, value, valid)
        return float(value)

    return check


def on_flagged(name: str, value: Any) -> str:
    if value not in ("fail", "warn"):
        raise FieldError(name, value, "must be fail (end the job, naming the node) or warn")
    return str(value)


def straggler_action(name: str, value: Any) -> str:
    if value not in ("warn", "replace"):
        raise FieldError(name, value, "must be warn (name it) or replace (swap it for a spare)")
    return str(value)
