"""Run folders: one per submission, holding the spec, the scripts, the job id and the logs.

A fresh cluster reuses job ids, so a job is found through its run folder, never by id alone;
and every path handed out here stays inside the runs root, whatever a user typed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clustertrain.errors import UserError
from clustertrain.render import RenderedJob

RECORD = "job.json"
DEFAULT_RUNS_DIR = "runs"
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def runs_root(flag: str | None) -> Path:
    """The runs root: ``--runs-dir``, else ``$CLUSTERTRAIN_RUNS_DIR``, else ``./runs``."""
    root = Path(flag or os.environ.get("CLUSTERTRAIN_RUNS_DIR") or DEFAULT_RUNS_DIR).absolute()
    if not str(root).isprintable() or "%" in str(root):
        raise UserError(
            f"runs dir: {str(root)!r} is not usable by Slurm (no '%' or control "
            "characters); pick another with --runs-dir"
        )
    return root


def new_run_dir(root: Path, name: str, now: datetime | None = None) -> Path:
    """A fresh, unique folder name for a submission of job ``name``."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    slug = _SLUG.sub("-", name).strip("-.")[:40] or "job"
    return root / f"{slug}-{stamp}-{os.urandom(3).hex()}"


@dataclass(frozen=True)
class Run:
    """A submitted job as its run folder records it."""

    path: Path
    job_id: str
    name: str
    submitted_at: str
    nodes: int
    world_size: int
    launcher: str

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def out_dir(self) -> Path:
        return self.path / "out"

    def final_metrics(self) -> dict[str, Any] | None:
        """The entrypoint's closing ``"event": "done"`` record, if the job wrote one."""
        metrics = self.out_dir / "metrics.jsonl"
        try:
            lines = metrics.read_text(encoding="utf-8").splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("event") == "done":
                return record
        return None


def write_run_files(job: RenderedJob) -> Path:
    """Create the run folder with what is about to be submitted. Fails if it exists."""
    import yaml

    path = Path(job.run_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    except OSError as exc:
        raise UserError(
            f"run folder: cannot create {path}: {exc.strerror}; choose another --runs-dir"
        ) from exc
    try:
        (path / "logs").mkdir()
        (path / "out").mkdir()
        (path / "spec.yaml").write_text(
            yaml.safe_dump(job.spec.to_dict(), sort_keys=False, allow_unicode=True),
            encoding="utf-8",
        )
        Path(job.batch_path).write_text(job.batch_script, encoding="utf-8")
        Path(job.launch_path).write_text(job.launch_script, encoding="utf-8")
    except OSError as exc:
        shutil.rmtree(path, ignore_errors=True)
        raise UserError(
            f"run folder: cannot write {path}: {exc.strerror}; "
            "free some space or choose another --runs-dir"
        ) from exc
    return path


def record_submission(job: RenderedJob, job_id: str) -> Run:
    run = Run(
        path=Path(job.run_dir),
        job_id=job_id,
        name=job.spec.name,
        submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        nodes=job.spec.nodes,
        world_size=job.spec.world_size,
        launcher=job.spec.launcher,
    )
    fields = {k: v for k, v in vars(run).items() if k != "path"}
    tmp = run.path / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(fields, indent=1) + "\n", encoding="utf-8")
    tmp.replace(run.path / RECORD)
    return run


def _load(path: Path) -> Run | None:
    try:
        data = json.loads((path / RECORD).read_text(encoding="utf-8"))
        return Run(
            path=path,
            **{
                k: data[k]
                for k in ("job_id", "name", "submitted_at", "nodes", "world_size", "launcher")
            },
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def all_runs(root: Path) -> list[Run]:
    """Every recorded run under ``root``, newest first."""
    if not root.is_dir():
        return []
    runs = [
        run
        for child in root.iterdir()
        if child.is_dir() and not child.is_symlink() and (run := _load(child)) is not None
    ]
    return sorted(runs, key=lambda r: (r.submitted_at, r.path.name), reverse=True)


def find_run(root: Path, ref: str) -> Run:
    """The run a user means: ``last``, a job id (the newest run with it) or a run folder."""
    runs = all_runs(root)
    if ref == "last":
        if not runs:
            raise UserError(f"JOB: no jobs recorded under {root}; submit one first")
        return runs[0]
    if ref.isdigit():
        for run in runs:
            if run.job_id == ref:
                return run
        raise UserError(f"JOB: no job {ref} recorded under {root}; see `clustertrain list`")
    # A folder must be a direct child of the runs root: no symlink or '..' escapes it.
    candidate = Path(ref) if os.path.isabs(ref) else root / Path(ref).name
    for run in runs:
        if run.path == candidate.absolute() or run.path.name == ref:
            return run
    raise UserError(f"JOB: {ref!r} is neither a job id, 'last' nor a run folder under {root}")
