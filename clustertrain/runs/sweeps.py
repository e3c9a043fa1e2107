"""A sweep's run-folder files: the table of its tasks (``sweep.json``: task number to
parameters) and each task's folder under ``tasks/``. What a sweep is, and the tasks' order, is
clustertrain.spec.sweep's."""

from __future__ import annotations

import json
from pathlib import Path

from clustertrain.files import RunFolderError, parse_json, read_regular
from clustertrain.protocol import SWEEP_TABLE as TABLE
from clustertrain.protocol import TASKS_DIR
from clustertrain.spec.sweep import MAX_TASKS, Sweep, tasks

__all__ = ["TABLE", "TASKS_DIR", "read_table", "write_table"]


def write_table(run_dir: Path, sweep: Sweep) -> None:
    rows = [{"task": k, "params": p} for k, p in enumerate(tasks(sweep))]
    (run_dir / TABLE).write_text(json.dumps({"tasks": rows}, indent=1) + "\n", encoding="utf-8")


def read_table(run_dir: Path) -> dict[int, dict[str, str]]:
    """Task number to parameters, from a run folder's ``sweep.json``; {} when there is none or
    it is not what clustertrain wrote."""

    try:
        data = parse_json(read_regular(run_dir / TABLE, 16 << 20), str(run_dir / TABLE))
        rows = data["tasks"]
        table = {int(r["task"]): {str(k): str(v) for k, v in r["params"].items()} for r in rows}
    except (RunFolderError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return {k: v for k, v in table.items() if 0 <= k < MAX_TASKS}
