"""The plan: what the renderer decided for a job, as the supervisor reads it back.

``clustertrain.render`` writes ``plan.json`` beside the batch script (the dry run shows it); the
supervisor (:mod:`clustertrain.node.supervisor`) reads it with :meth:`Plan.read`, which checks
every value: a run folder is anyone's to write, and a plan that is not the renderer's is
refused, not obeyed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustertrain import protocol
from clustertrain.files import RunFolderError, parse_json, read_regular
from clustertrain.node import policy

__all__ = ["PLAN_FILE", "Plan", "PlanError", "Word"]

PLAN_FILE = protocol.PLAN_FILE
_MAX_PLAN_BYTES = 1 << 20


class PlanError(ValueError):
    """A plan file that is not what the renderer writes."""


# A word of a command: text as is, or {"expand": "$VAR..."}: the variables this supervisor and
# the batch script set (HEAD_NODE, LOG_DIR, CLUSTERTRAIN_NODES, TASK_DIR), expanded here.
Word = str | dict[str, str]


@dataclass(frozen=True)
class Plan:
    """What the renderer decided for this job (clustertrain.render writes it beside the batch
    script, the dry run shows it)."""

    step: tuple[Word, ...]
    node_check: tuple[Word, ...] | None
    logs_dir: Word
    nodes: int
    spare_nodes: int
    hang_timeout_s: int
    hang_on_quiet: bool
    policy: policy.Policy
    tasks: dict[str, tuple[str, ...]] | None  # a sweep's array tasks: their arguments
    # Qualification (clustertrain.node.qualify): the node check then runs on every node of the
    # allocation, spares too, and these decide what a flagged node means.
    qualify: bool = False
    compute_threshold: float = 2.0
    link_threshold: float = 10.0
    on_flagged: str = "fail"
    straggler_threshold: float = 2.0
    straggler_action: str = "warn"

    @classmethod
    def read(cls, path: Path) -> Plan:
        try:
            data = read_regular(path, _MAX_PLAN_BYTES)
        except RunFolderError as exc:
            raise PlanError(str(exc)) from None
        try:
            return cls.from_dict(parse_json(data, str(path)))
        except (RunFolderError, ValueError, TypeError, KeyError) as exc:
            raise PlanError(f"{path}: not a clustertrain plan ({exc})") from None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Plan:
        tasks = raw["tasks"]
        return cls(
            step=_words(raw["step"]),
            node_check=None if raw["node_check"] is None else _words(raw["node_check"]),
            logs_dir=_words([raw["logs_dir"]])[0],
            nodes=_count(raw["nodes"]),
            spare_nodes=_count(raw["spare_nodes"], low=0),
            hang_timeout_s=_count(raw["hang_timeout_s"]),
            hang_on_quiet=_flag(raw["hang_on_quiet"]),
            policy=policy.Policy(
                _count(raw["max_restarts"], low=0),
                _count(raw["max_requeues"], low=0),
                _flag(raw["requeue_on_node_failure"]),
                _count(raw.get("storm_restarts", 3), low=0),
            ),
            tasks=None
            if tasks is None
            else {str(_count(int(k), low=0)): _texts(v) for k, v in dict(tasks).items()},
            qualify=_flag(raw.get("qualify", False)),
            compute_threshold=_ratio(raw.get("compute_threshold", 2.0)),
            link_threshold=_ratio(raw.get("link_threshold", 10.0)),
            on_flagged=_choice(raw.get("on_flagged", "fail"), ("fail", "warn")),
            straggler_threshold=_ratio(raw.get("straggler_threshold", 2.0)),
            straggler_action=_choice(raw.get("straggler_action", "warn"), ("warn", "replace")),
        )


def _words(raw: Any) -> tuple[Word, ...]:
    if not isinstance(raw, list):
        raise TypeError("a command is a list")
    for word in raw:
        if not (isinstance(word, str) or (isinstance(word, dict) and list(word) == ["expand"])):
            raise TypeError(f"not a word: {str(word)[:60]}")
    return tuple(raw)


def _texts(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(w, str) for w in raw):
        raise TypeError("arguments are a list of strings")
    return tuple(raw)


def _count(raw: Any, low: int = 1) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw < 1_000_000_000:
        raise TypeError(f"not a count: {str(raw)[:20]}")
    return raw


def _ratio(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 1 < raw <= 1000:
        raise TypeError(f"not a threshold: {str(raw)[:20]}")
    return float(raw)


def _choice(raw: Any, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise TypeError(f"not one of {', '.join(choices)}: {str(raw)[:20]}")
    return str(raw)


def _flag(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise TypeError(f"not true or false: {str(raw)[:20]}")
    return raw
