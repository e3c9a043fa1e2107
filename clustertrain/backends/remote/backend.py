"""``RemoteBackend``: a login node's clustertrain, over ssh, behind the one backend interface.

Submitting with a host (``submit --host``, ``notebook_launcher(host=...)``) plans and checks the
job here, then queues it through this backend like any other: its request (request.Request) is
the login node's command line, which renders, checks against the real cluster's limits,
prepares and queues the job in a snapshot of the code (snapshot.py); this side keeps the record
(record.py). ``status``, ``cancel`` and ``logs`` of such a run are the login node's answers
(stream.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from clustertrain.backends.base import Backend
from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, parse_json, printable
from clustertrain.jobstate import JOB_IDS, JobState
from clustertrain.protocol import NODE_NAME
from clustertrain.render import RenderedJob
from clustertrain.runs import Run, runs_root

from . import request as requests
from . import snapshot, ssh
from .record import Remote, of, run_words
from .request import ERROR, Request
from .stream import Streamed, fetch, forward
from .stream import follow as follow_logs

# A state (``status --json``) or a cancel's words are a few hundred bytes; a MiB is plenty.
ANSWER_BYTES = 1 << 20

if TYPE_CHECKING:
    from clustertrain.runs.logs import Filter


class RemoteBackend(Backend):
    """Jobs a login node's clustertrain renders, checks and queues: made for a ``request`` (a
    submission) or for a ``remote`` run already recorded here (what it answers)."""

    name = "ssh"
    job_ids = JOB_IDS["ssh"]
    accepted = "queued"
    queues_here = False
    no_accounting = "no accounting asked: a login node's job"

    def __init__(
        self,
        remote: Remote | None = None,
        request: Request | None = None,
        runs_root: Path | None = None,
        echo: Callable[[str], None] = print,
    ) -> None:
        self._remote, self.request, self.runs_root, self.echo = remote, request, runs_root, echo
        self._queued: Run | None = None

    @classmethod
    def for_run(cls, run: Run) -> RemoteBackend:
        found = of(run)
        if found is None:
            raise UserError(f"{run.path}: no login node's record here; it was not sent with a host")
        return cls(found)

    @property
    def remote(self) -> Remote:
        if self._remote is None:
            raise UserError("host: no job has been queued through this login node yet")
        return self._remote

    @staticmethod
    def cancel_command(job_id: str) -> str:
        return f"scancel {job_id}  (on the login node)"

    def check(self, job: RenderedJob, preflight: bool = True) -> None:
        """What can be refused here before anything reaches the host: the host itself, and a
        job file the snapshot would not hold (the login node would read whatever is at that path
        on its own disk). The login node's clustertrain checks the rest against its cluster."""
        request = self._request()
        ssh.check_host(request.host)
        if request.job_file is not None:
            snapshot.check_inside(Path(request.job_file), Path.cwd())

    def submit(self, job: RenderedJob) -> str:
        request = self._request()
        run = requests.queue(request, Path.cwd(), self._runs_root(), self.echo)
        if run is None:
            raise UserError("host: a dry run queues nothing; see dry_run()")
        self._queued, self._remote = run, of(run)
        return run.job_id

    def dry_run(self) -> None:
        """What the login node would submit, printed there (the request says ``--dry-run``)."""
        requests.queue(self._request(), Path.cwd(), self._runs_root(), self.echo)

    def record(self, job: RenderedJob, job_id: str) -> Run:
        if self._queued is None or self._queued.job_id != job_id:
            raise UserError(f"host: job {job_id} was not queued through this backend")
        return self._queued  # recorded by queue, as the login node wrote it

    def state(self, run: Run) -> JobState:
        said = self._ask("status", "--json")
        try:
            return JobState.from_dict(parse_json(said, "status --json"))
        except (RunFolderError, ValueError) as error:
            raise UserError(
                f"host: {self.remote.host}: status said no job state ({error})"
            ) from None

    def cancel(self, run: Run) -> None:
        self._ask("cancel")

    def logs(self, run: Run, filters: Filter, follow: bool = False) -> Iterator[str]:
        streamed = Streamed(self.remote, filters.words(), follow, say_end=False)
        return (line.rstrip("\n") for line in streamed)

    def sync(self, run: Run) -> None:
        fetch(self.remote, run.path)

    def relay(self, run: Run, command: str, args: Sequence[str] = (), follow: bool = False) -> int:
        if command == "logs" and follow:
            return follow_logs(self.remote, args)
        # attach's shell needs a terminal on the login node too (srun --pty there)
        return forward(self.remote, command, args, tty=command == "attach" and sys.stdin.isatty())

    def node_command(
        self, run: Run, argv: Sequence[str], node: str | None = None, pty: bool = False
    ) -> list[str]:
        """The login node's ``srun`` into the allocation, through ssh (one shared connection;
        ``-t``: a terminal there too, for ``--pty``)."""
        if node is not None and not NODE_NAME.fullmatch(node):
            raise UserError(f"--node: {node[:40]!r} is not a node name (e.g. node2)")
        words = ["srun", f"--jobid={run.job_id}", "--overlap", "--ntasks-per-node=1"]
        words += [f"--nodelist={node}", "--nodes=1", "--ntasks=1"] if node else []
        words += ["--pty"] if pty else []
        return ssh.argv(self.remote.host, [*words, "--", *argv], tty=pty)

    def host(self) -> str:
        return self.remote.host

    def _request(self) -> Request:
        if self.request is None:
            raise UserError("host: this backend answers for a recorded run; it queues nothing")
        return self.request

    def _runs_root(self) -> Path:
        return self.runs_root or runs_root(None)

    def _ask(self, command: str, *args: str) -> str:
        """``clustertrain COMMAND RUN ARGS`` on the host; its output, or its error as one line."""
        words = [self.remote.clustertrain, command, *run_words(self.remote), *args]
        done = ssh.run(self.remote.host, words, timeout=120, limit=ANSWER_BYTES, what=command)
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
            why = said[-1].removeprefix(ERROR)[:300]
            raise UserError(
                f"{printable(why)} (on {self.remote.host}, exit status {done.returncode})"
            )
        return done.stdout.decode("utf-8", "replace")
