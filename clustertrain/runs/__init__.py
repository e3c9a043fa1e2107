"""Run folders, one per submission, and what is read from them: ``folder`` (find, write and
record them), ``logs`` and ``follow`` (every rank's lines), ``timeline`` (attempts, phases,
goodput), ``results`` (a sweep's table) and ``plot`` (the picture)."""

from clustertrain.runs.folder import (
    DEFAULT_RUNS_DIR,
    PREPARE_LOG,
    RECORD,
    Run,
    all_runs,
    find_run,
    make_run_folder,
    new_run_dir,
    read_run,
    record_submission,
    runs_root,
    task,
    tasks,
    write_run_files,
)

__all__ = [
    "DEFAULT_RUNS_DIR",
    "PREPARE_LOG",
    "RECORD",
    "Run",
    "all_runs",
    "find_run",
    "make_run_folder",
    "new_run_dir",
    "read_run",
    "record_submission",
    "runs_root",
    "task",
    "tasks",
    "write_run_files",
]
