"""Run folders: one per submission, holding the spec, the scripts, the job id and the logs.

A fresh cluster reuses job ids, so a job is found through its run folder, never by id alone;
and every path handed out here stays inside the runs root, whatever a user typed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, parse_json, printable, read_regular, write_private
from clustertrain.jobstate import JOB_IDS
from clustertrain.rank import events
from clustertrain.render import RenderedJob, container
from clustertrain.runs import sweeps
from clustertrain.spec import sweep
from clustertrain.spec.fields import LAUNCHERS

RECORD = protocol.RECORD_FILE
PREPARE_LOG = protocol.PREPARE_LOG
DEFAULT_RUNS_DIR = "runs"
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_RECORD_BYTES = 64 << 10
# The time new_run_dir puts in a folder's name, and how far two clocks (this one, a login
# node's) may disagree before a time is taken for a forged one.
_STAMP = re.compile(r"-([0-9]{8}-[0-9]{6})-[0-9a-f]{6}$")
CLOCK_SKEW_S = 300.0


def runs_root(flag: str | None) -> Path:
    """The runs root: ``--runs-dir``, else ``$CLUSTERTRAIN_RUNS_DIR``, else ``./runs``."""
    root = Path(flag or os.environ.get("CLUSTERTRAIN_RUNS_DIR") or DEFAULT_RUNS_DIR).absolute()
    if not str(root).isprintable() or "%" in str(root):
        raise UserError(
            f"runs dir: {str(root)[:100]!r} is not usable by Slurm (no '%' or control "
            "characters); pick another with --runs-dir"
        )
    # A name the filesystem cannot hold would fail every later call (ENAMETOOLONG) instead.
    if len(os.fsencode(root)) > 3000 or any(len(os.fsencode(p)) > 255 for p in root.parts):
        raise UserError(
            f"runs dir: {str(root)[:60]!r}... is longer than a file name may be (255 bytes a "
            "part); pick another with --runs-dir"
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
    # The job's headline metric (JobSpec.metric) and which way it is better; None: none named.
    metric: str | None = None
    metric_mode: str = "max"
    # The backend that queued or started it (clustertrain.backends.BACKENDS). A run submitted
    # with --host records "slurm" (the login node's), and a remote.json beside job.json.
    backend: str = "slurm"

    @property
    def task_number(self) -> int | None:
        """K for task ``ID_K`` of a sweep; None for a job or a whole array."""
        _, sep, number = self.job_id.partition("_")
        return int(number) if sep else None

    @property
    def folder(self) -> Path:
        """The run folder that holds this run's files (a task's: its job's), which every read
        stays inside (clustertrain.files.open_regular's ``within``)."""
        return self.path if self.task_number is None else self.path.parent.parent

    @property
    def logs_dir(self) -> Path:
        return self.path / protocol.LOGS_DIR

    @property
    def out_dir(self) -> Path:
        return self.path / protocol.OUT_DIR

    @property
    def events_path(self) -> Path:
        return self.path / protocol.EVENTS_FILE

    def events(
        self, warn: Callable[[str], None] | None = None, most: int | None = None
    ) -> list[events.Event]:
        """The job's events within its own time window: from a minute before it was submitted
        to a minute from now. What is left out (a line that is no event, a value that is not
        finite, a time outside the window) is said once through ``warn``. ``most``: about
        how many of each frequent event (``metrics``, ``step``) a picture needs
        (:func:`clustertrain.rank.events.scan`)."""
        found, dropped = events.scan(
            self.events_path, *self.window(), within=self.folder, most=most
        )
        if dropped and warn is not None:
            warn(
                f"{self.events_path}: {dropped} line(s) left out: not an event, a value that is "
                "not a finite number, or a time outside the job's own time window"
            )
        return found

    def window(self) -> tuple[float, float]:
        """The job's own time window, which every event read must lie in: from a minute before
        it was submitted to a minute from now."""
        try:
            submitted = datetime.fromisoformat(self.submitted_at).timestamp()
        except ValueError:
            submitted = -math.inf
        return submitted - 60, time.time() + 60

    def metrics(self, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        """What the job's ``runtime.log_metrics`` calls recorded, in order: each call's values,
        with its ``step`` where it gave one, its ``time`` and its ``attempt``."""
        return [
            {**e.values, "time": e.time, "attempt": e.attempt}
            for e in self.events(warn)
            if e.name == "metrics"
        ]


def private_mode(root: Path) -> int:
    """A run folder's mode: its user's alone (0700: it holds the code, the logs and the
    checkpoints), unless its runs root is a team's (setgid, as `chmod g+s` makes it): then the
    group reads it too (2750), and writes nothing in it."""
    return 0o2750 if root.stat().st_mode & stat.S_ISGID else 0o700


def make_run_folder(path: Path) -> None:
    """Create the run folder ``path`` with :func:`private_mode`, and its runs root, the user's
    alone, if there is none yet; an :class:`OSError` if it exists."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    path.mkdir(mode=0o700)
    path.chmod(private_mode(path.parent))


def write_run_files(
    job: RenderedJob,
    prepare_log: BinaryIO | None = None,
    private: Mapping[str, bytes] | None = None,
) -> Path:
    """Create the run folder with what is about to be submitted (and the output of its prepare
    commands, and the ``private`` files, name: content, this user's alone: 0600). Fails if it
    exists."""
    import shutil  # lazy: start-up time (2 ms); a dry run writes no folder

    import yaml  # lazy: start-up time (4 ms), likewise

    path = Path(job.run_dir)
    try:
        make_run_folder(path)
    except OSError as exc:
        raise UserError(
            f"run folder: cannot create {path}: {exc.strerror}; choose another --runs-dir"
        ) from exc
    try:
        (path / protocol.LOGS_DIR).mkdir()
        (path / protocol.OUT_DIR).mkdir()
        if job.spec.sweep:  # each task a run folder of its own; Slurm creates no folders
            sweeps.write_table(path, job.spec.sweep)
            for task in range(len(sweep.tasks(job.spec.sweep))):
                for sub in (protocol.LOGS_DIR, protocol.OUT_DIR):
                    (path / sweeps.TASKS_DIR / str(task) / sub).mkdir(parents=True)
        (path / protocol.SPEC_FILE).write_text(
            yaml.safe_dump(job.spec.to_dict(), sort_keys=False, allow_unicode=True),
            encoding="utf-8",
        )
        Path(job.batch_path).write_text(job.batch_script, encoding="utf-8")
        Path(job.launch_path).write_text(job.launch_script, encoding="utf-8")
        Path(job.plan_path).write_text(job.plan, encoding="utf-8")
        if job.spec.prepare and prepare_log is not None:
            with open(path / PREPARE_LOG, "wb") as kept:
                shutil.copyfileobj(prepare_log, kept)
        for name, data in (private or {}).items():
            write_private(path / name, data)
        if job.container_config is not None:
            bundle = Path(container.bundle_path(job.run_dir))
            (bundle / container.BUNDLE_ROOTFS).mkdir(parents=True)
            (bundle / "config.json").write_text(job.container_config, encoding="utf-8")
    except OSError as exc:
        shutil.rmtree(path, ignore_errors=True)
        raise UserError(
            f"run folder: cannot write {path}: {exc.strerror}; "
            "free some space or choose another --runs-dir"
        ) from exc
    return path


def record_submission(job: RenderedJob, job_id: str, backend: str) -> Run:
    run = Run(
        path=Path(job.run_dir),
        job_id=job_id,
        name=job.spec.name,
        submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        nodes=job.spec.nodes,
        world_size=job.spec.world_size,
        launcher=job.spec.launcher,
        metric=job.spec.metric,
        metric_mode=job.spec.metric_mode,
        backend=backend,
    )
    fields = {k: v for k, v in vars(run).items() if k != "path"}
    tmp = run.path / f".{RECORD}.tmp"
    tmp.write_text(json.dumps(fields, indent=1) + "\n", encoding="utf-8")
    tmp.replace(run.path / RECORD)
    events.append(run.events_path, events.QUEUED)
    for task in tasks(run):
        events.append(task.events_path, events.QUEUED)
    return run


def tasks(run: Run) -> list[Run]:
    """A sweep's tasks as runs of their own (``ID_K``, folder ``tasks/K``); [] for a job."""
    if run.task_number is not None:
        return []
    table = sweeps.read_table(run.path)
    return [task(run, k) for k in sorted(table)]


def task(run: Run, number: int) -> Run:
    """Task ``number`` of a sweep, whose folder is ``tasks/K`` of the run folder, there: a
    ``tasks`` or task folder that is a symlink (a run folder is anyone's) is refused."""
    folder = run.path / sweeps.TASKS_DIR / str(number)
    for part in (folder.parent, folder):
        if part.is_symlink():
            raise RunFolderError(f"{part}: a symlink, not a task's folder; it is not read")
    return dataclasses.replace(run, path=folder, job_id=f"{run.job_id}_{number}")


# job.json's fields: (type, check) each; anything else in the file is refused.
_RECORD_FIELDS: dict[str, Callable[[Any], bool]] = {
    "job_id": lambda v: isinstance(v, str) and len(v) <= 64,
    "name": lambda v: isinstance(v, str) and 0 < len(v) <= 128,
    "submitted_at": lambda v: isinstance(v, str) and len(v) <= 64,
    "nodes": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 100_000,
    "world_size": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 10**7,
    "launcher": lambda v: v in LAUNCHERS,
    "metric": lambda v: v is None or (isinstance(v, str) and _is_metric(v)),
    "metric_mode": lambda v: v in protocol.METRIC_MODES,
    "backend": lambda v: v in JOB_IDS,
}
# Fields a run recorded before they existed lacks: it reads as having the default.
_OPTIONAL = {"metric", "metric_mode", "backend"}


def _is_metric(text: str) -> bool:
    return protocol.METRIC_NAME.fullmatch(text) is not None


def _any_job_id(text: str) -> bool:
    """Whether what a user typed is a job id (of any backend), not a folder."""
    return any(_is_job_id(text, backend) for backend in JOB_IDS)


def _is_job_id(text: str, backend: str) -> bool:
    """An id of the run's own backend: a Slurm job's (``42``, ``42_3``), a local run's
    (``local-1234``)."""
    return JOB_IDS[backend].fullmatch(text) is not None


def read_run(path: Path) -> Run:
    """The run recorded in ``path``, with every field of ``job.json`` checked."""
    data = read_regular(path / RECORD, _MAX_RECORD_BYTES)
    try:
        record = parse_json(data, str(path / RECORD))
    except RunFolderError:
        raise RunFolderError(f"{path / RECORD}: not JSON") from None
    if (
        not isinstance(record, dict)
        or not set(record) <= set(_RECORD_FIELDS)
        or not set(_RECORD_FIELDS) - _OPTIONAL <= set(record)
    ):
        raise RunFolderError(f"{path / RECORD}: not a clustertrain job record")
    for key, check in _RECORD_FIELDS.items():
        if key in record and not check(record[key]):
            raise RunFolderError(f"{path / RECORD}: bad {key} {printable(repr(record[key]))[:60]}")
    if not _is_job_id(record["job_id"], record.get("backend", "slurm")):
        raise RunFolderError(
            f"{path / RECORD}: bad job_id {printable(repr(record['job_id']))[:60]} for its backend"
        )
    return Run(path=path, **record)


def all_runs(root: Path, warn: Callable[[str], None] | None = None) -> list[Run]:
    """Every recorded run under ``root``, newest first; a malformed one is skipped, with a
    warning to ``warn``. Folders without a record (not a submission) are left out silently."""
    if not root.is_dir():
        return []
    try:
        children = list(root.iterdir())
    except OSError as exc:  # another user's runs root, private to them
        raise UserError(f"runs dir: cannot read {root}: {exc.strerror}") from None
    runs = []
    for child in children:
        try:
            if not child.is_dir() or child.is_symlink() or not (child / RECORD).exists():
                continue
            runs.append(read_run(child))
        except (RunFolderError, OSError) as exc:
            if warn is not None:
                warn(f"skipping a run folder: {printable(str(exc))}")
    return sorted(runs, key=lambda r: (r.submitted_at, r.path.name), reverse=True)


def _yours(path: Path) -> bool:
    try:
        return os.lstat(path).st_uid == os.getuid()
    except OSError:
        return False


def _plausible(run: Run, now: float) -> bool:
    """Whether ``run`` may be the newest: recorded at a time that has come (a clock's skew
    aside), no earlier than the time its folder's name says it was made (new_run_dir)."""
    try:
        submitted = datetime.fromisoformat(run.submitted_at)
        if submitted.tzinfo is None:
            return False
    except ValueError:
        return False
    if submitted.timestamp() > now + CLOCK_SKEW_S:
        return False
    named = _STAMP.search(run.path.name)
    if named is None:
        return True  # a folder named by hand: no time of its own to check
    try:
        made = datetime.strptime(named[1], "%Y%m%d-%H%M%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return False
    return made.timestamp() <= submitted.timestamp() + CLOCK_SKEW_S


def find_run(root: Path, ref: str) -> Run:
    """The run a user means: ``last``, a job id (the newest run with it) or a run folder."""
    if ref != "last" and not _any_job_id(ref) and Path(ref).name not in ("", ".", ".."):
        # A folder must be a direct child of the runs root: no symlink or '..' escapes it.
        folder = Path(ref).absolute() if os.path.isabs(ref) else root / Path(ref).name
        with contextlib.suppress(OSError):  # e.g. a name too long for the filesystem
            if folder.parent == root and not folder.is_symlink() and (folder / RECORD).exists():
                return read_run(folder)
    # A teammate in a shared runs root can write folders beside yours: their claims (a job id
    # of yours, a time in 9999) must not make `last` or an id mean their folder.
    runs = [run for run in all_runs(root) if _yours(run.path)]
    if ref == "last":
        now = time.time()
        plausible = [run for run in runs if _plausible(run, now)]
        if not plausible:
            raise UserError(f"JOB: no jobs of yours recorded under {root}; submit one first")
        return plausible[0]
    if _any_job_id(ref):
        array, _, number = ref.partition("_")
        for run in runs:
            if run.job_id == ref:
                return run
            if number and run.job_id == array:
                if int(number) in sweeps.read_table(run.path):
                    return task(run, int(number))
                raise UserError(f"JOB: array {array} has no task {number}; see `results {array}`")
        raise UserError(
            f"JOB: no job {ref} of yours recorded under {root}; see `clustertrain list`"
        )
    raise UserError(
        f"JOB: {printable(repr(ref))[:80]} is neither a job id, 'last' nor a run folder "
        f"under {root}"
    )
