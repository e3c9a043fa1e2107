"""The one module that calls Slurm: sbatch (through submitit), scontrol, squeue, sacct, scancel,
sinfo.

Commands go through a small runner that tests replace; reading their output is pure
functions beside the calls (``parse.py``). Without slurmdbd, ``sacct`` is unavailable, so a
job's state comes from ``scontrol`` while Slurm remembers the job (``MinJobAge``), then from
``sacct`` where accounting exists, then from the job-completion log (``sacct --completion``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from clustertrain.errors import SchedulerUnreachable, UserError
from clustertrain.jobstate import JOB_ID, Accounting, Allocation, Holding, JobState
from clustertrain.protocol import NODE_NAME
from clustertrain.render import RenderedJob
from clustertrain.render.container import APPTAINER
from clustertrain.spec.fields import CONTAINER_RUNTIMES

from .cluster_info import ClusterInfo
from .parse import (
    ACCOUNTING_FIELDS,
    ALLOCATION_FIELDS,
    node_list,
    parse_accounting,
    parse_allocations,
    parse_down_events,
    parse_holding,
    parse_nodes,
    parse_partitions,
    parse_sacct,
    parse_scontrol_job,
    parse_spans,
    unreachable,
)

# The newest allocations whose lost nodes are asked of accounting, one sacctmgr call each.
MAX_SPANS = 8

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class SlurmUnreachable(SchedulerUnreachable):
    """Slurm's commands fail (no configuration, the controller down, no commands): not a job
    state."""


def checked_job_id(job_id: str) -> str:
    if not JOB_ID.fullmatch(job_id):
        raise UserError(f"JOB: {job_id[:40]!r} is not a Slurm job id (digits, or N_M)")
    return job_id


def checked_node(node: str) -> str:
    """A node's name as srun's ``--nodelist`` may take it: one plain name, never a range, an
    option or a second line."""
    if not NODE_NAME.fullmatch(node):
        raise UserError(f"--node: {node[:40]!r} is not a node name (e.g. node2)")
    return node


def slurm_environ(conf: Path | None = None) -> dict[str, str]:
    """The environment for Slurm's commands: the user's, pointed at ``conf`` if given.

    A ``SLURM_CONF`` that names no file is refused at once: Slurm's commands would retry
    reading it for 60 s before giving up. Which configuration a command should use when none is
    named is the caller's to say (``clustertrain.api.slurm`` knows the local cluster's).
    """
    environ = dict(os.environ)
    if conf is not None:
        environ["SLURM_CONF"] = str(conf)
        return environ
    conf_text = environ.get("SLURM_CONF")
    if conf_text is not None and not Path(conf_text).is_file():
        raise UserError(
            f"SLURM_CONF: {conf_text} does not exist; point it at the cluster's slurm.conf "
            "or unset it"
        )
    return environ


def _run(argv: Sequence[str], conf: Path | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=slurm_environ(conf),
            timeout=60,
            check=False,
        )
    except FileNotFoundError as exc:
        raise SlurmUnreachable(
            f"{argv[0]}: not found; run clustertrain where Slurm's commands are "
            "installed (a login node), or start a local cluster with "
            "`clustertrain cluster up`"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnreachable(
            f"{argv[0]}: no answer from Slurm within 60 s; check `scontrol ping`"
        ) from exc


def _first_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(no message)"])[-1]


class Slurm:
    """Slurm's commands, run through ``runner`` (``subprocess.run`` by default)."""

    def __init__(
        self, runner: Runner | None = None, conf: Path | None = None, bin_dir: Path | None = None
    ) -> None:
        """``conf``: the slurm.conf to use (the local cluster's), else the environment's;
        ``bin_dir``: the folder of Slurm's commands, else PATH's."""
        self.conf = conf
        where = (lambda name: str(bin_dir / name)) if bin_dir is not None else str
        self._runner = runner or (lambda argv: _run([where(argv[0]), *argv[1:]], conf))

    @property
    def environ(self) -> dict[str, str]:
        """The environment this runs Slurm's commands in."""
        return slurm_environ(self.conf)

    def _call(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self._runner(argv)

    def submit(self, job: RenderedJob) -> str:
        """Queue ``job``'s batch script through submitit's Slurm executor; return the job id.

        The run folder must exist already. submitit writes the script it hands to sbatch into
        that folder (``<id>_submission.sh``); its text is exactly ``job.batch_script``.
        """
        import submitit  # lazy: start-up time (0.1 s), only a submission needs it
        from submitit.core.utils import FailedJobError

        # sbatch runs in submitit's process environment; this one names the configuration
        # through env(1) instead of changing this process's environment.
        conf = ["env", f"SLURM_CONF={self.conf}"] if self.conf is not None else []

        class Executor(submitit.SlurmExecutor):
            def _make_submission_file_text(self, command: str, uid: str) -> str:
                return job.batch_script

            def _make_submission_command(self, submission_file_path: Path) -> list[str]:
                return [*conf, *super()._make_submission_command(submission_file_path)]

        try:
            executor = Executor(folder=job.run_dir)
            # submitit's documented low-level path for a ready-made script: no pickled callable.
            # It echoes sbatch's stderr on failure; the error below says it in one line instead.
            with contextlib.redirect_stderr(io.StringIO()):
                return str(executor._submit_command("").job_id)
        except RuntimeError as exc:
            if isinstance(exc, FailedJobError):
                raise UserError(f"sbatch failed: {_first_error_line(str(exc))}") from exc
            raise UserError(f"sbatch: {exc}; is this a Slurm login node?") from exc

    def state(self, job_id: str) -> JobState:
        """The job's state; :class:`SlurmUnreachable` when Slurm cannot be asked at all.

        Only "Invalid job id" sends the question on to accounting: the controller forgets a
        finished job after MinJobAge. Any other failure (no controller, no configuration) is
        an answer of its own, never a state read from an old completion log.
        """
        shown = self._call("scontrol", "show", "job", "--oneliner", checked_job_id(job_id))
        if shown.returncode == 0 and shown.stdout.strip():
            return parse_scontrol_job(job_id, shown.stdout)
        if "Invalid job id" not in shown.stderr:
            raise SlurmUnreachable(
                f"cannot ask Slurm about job {job_id}: {_first_error_line(shown.stderr)}; "
                "check `scontrol ping` and SLURM_CONF"
            )
        accounted = self._call(
            "sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State,NodeList,Elapsed,ExitCode"
        )
        if accounted.returncode == 0 and accounted.stdout.strip():
            return parse_sacct(job_id, accounted.stdout)
        completed = self._call(
            "sacct", "--completion", "-j", job_id, "-n", "-P", "-o", "JobID,State,NodeList,Elapsed"
        )
        if completed.returncode == 0 and completed.stdout.strip():
            return parse_sacct(job_id, completed.stdout)
        return JobState(job_id=job_id, state="UNKNOWN")

    def holding(self, job_id: str) -> Holding:
        """What the controller says of the job's hold on its nodes, the NodeList expanded by
        Slurm itself (``node[1-3]``); a job it no longer holds is refused in one line."""
        shown = self._call("scontrol", "show", "job", "--oneliner", checked_job_id(job_id))
        if shown.returncode != 0 or not shown.stdout.strip():
            if "Invalid job id" in shown.stderr:
                raise UserError(f"JOB: {job_id}: Slurm no longer holds this job: it has ended")
            raise SlurmUnreachable(
                f"cannot ask Slurm about job {job_id}: {_first_error_line(shown.stderr)}"
            )
        listed = node_list(shown.stdout)
        names = self._call("scontrol", "show", "hostnames", listed) if listed else None
        hostnames = names.stdout if names is not None and names.returncode == 0 else ""
        return parse_holding(job_id, shown.stdout, hostnames)

    def cancel(self, job_id: str) -> None:
        """``scancel``; :class:`SlurmUnreachable` when the controller cannot be asked (then
        nothing was cancelled)."""
        done = self._call("scancel", checked_job_id(job_id))
        if done.returncode == 0:
            return
        said = _first_error_line(done.stderr)
        if unreachable(done.stderr):
            raise SlurmUnreachable(
                f"cannot cancel job {job_id}: Slurm's controller cannot be reached ({said}); "
                "nothing was cancelled: cancel again once `scontrol ping` answers"
            )
        raise UserError(f"scancel {job_id}: {said}")

    def cluster_info(self) -> ClusterInfo:
        """Partitions and nodes as ``scontrol`` and ``sinfo`` report them."""
        parts = self._call("scontrol", "show", "partition", "--oneliner")
        nodes = self._call("sinfo", "--Node", "--noheader", "--format", "%N|%P|%c|%m|%G|%t")
        version = self._call("sinfo", "--version")
        for done in (parts, nodes):
            if done.returncode != 0:
                raise UserError(
                    f"cannot read the cluster's partitions: "
                    f"{_first_error_line(done.stderr)}; is Slurm reachable "
                    "(`scontrol ping`)?"
                )
        config = self._call("scontrol", "show", "config")
        array = re.search(r"^MaxArraySize\s*=\s*(\d+)", config.stdout, re.MULTILINE)
        missing = self._missing_runtimes(config.stdout)
        return ClusterInfo(
            version=version.stdout.strip(),
            partitions=parse_partitions(parts.stdout),
            nodes=parse_nodes(nodes.stdout),
            max_array_size=int(array[1]) if array else None,
            container_runtimes=frozenset(CONTAINER_RUNTIMES) - {name for name, _ in missing},
            missing_runtimes=missing,
        )

    def _missing_runtimes(self, config: str) -> tuple[tuple[str, str], ...]:
        """Each container runtime this cluster lacks, with what shows it. The nodes are taken
        to have what this host has: Slurm's configuration and the same software."""
        missing = []
        if "--container-image" not in self._call("srun", "--help").stdout:
            missing.append(("pyxis", "srun --help has no --container-image: no pyxis plugin"))
        if shutil.which(APPTAINER) is None:
            missing.append(("apptainer", f"no {APPTAINER} on PATH"))
        conf = re.search(r"^SLURM_CONF\s*=\s*(\S+)", config, re.MULTILINE)
        oci = Path(conf[1]).with_name("oci.conf") if conf else None
        if oci is None or not oci.is_file():
            missing.append(("oci", f"no {oci or 'oci.conf'}: srun --container is ignored"))
        return tuple(missing)

    def node_states(self) -> dict[str, str]:
        """Each node's state (``idle``, ``alloc``...); empty while slurmctld does not answer."""
        done = self._call("sinfo", "-h", "-N", "-o", "%N %T")
        if done.returncode != 0:
            return {}
        return dict(line.split(maxsplit=1) for line in done.stdout.splitlines() if " " in line)

    def job_ids(self, states: str | None = None) -> list[str]:
        """The ids in the queue, of the given states only (e.g. ``R,CG``) if given."""
        done = self._call("squeue", "-h", "-o", "%A", *(["-t", states] if states else []))
        return done.stdout.split() if done.returncode == 0 else []

    def cancel_all(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._call("scancel", *job_ids)

    def accounting(self, job_id: str) -> Accounting | None:
        """What slurmdbd recorded of the job and its steps; None without accounting (a
        cluster with no slurmdbd) or before it knows the job."""
        done = self._call(
            "sacct", "-j", checked_job_id(job_id), "-n", "-P", "-o", ACCOUNTING_FIELDS
        )  # fmt: skip
        found = parse_accounting(job_id, done.stdout) if done.returncode == 0 else None
        return replace(found, lost_nodes=self.lost_nodes(job_id)) if found is not None else None

    def lost_nodes(self, job_id: str) -> tuple[str, ...]:
        """The nodes that accounting recorded going DOWN while an allocation of the job that
        ended NODE_FAIL held them (sacctmgr's node events: their history, whatever the nodes'
        state is now); empty where accounting has none. Slurm tells srun of a lost node in a
        message of its own, which srun may never get: Slurm stops it in the same pass."""
        done = self._call(
            "sacct", "-j", checked_job_id(job_id), "-X", "--duplicates", "-n", "-P",
            "-o", "State,NodeList,Start,End",
        )  # fmt: skip
        lost: dict[str, None] = {}
        spans = parse_spans(done.stdout)[-MAX_SPANS:] if done.returncode == 0 else []
        for nodes, start, end in spans:
            events = self._call(
                "sacctmgr", "-n", "-P", "show", "event", f"nodes={nodes}", f"start={start}",
                f"end={end}", "format=NodeName,TimeStart,State",
            )  # fmt: skip
            if events.returncode == 0:
                lost.update(dict.fromkeys(parse_down_events(events.stdout, start)))
        return tuple(lost)

    def allocations(self, job_id: str) -> tuple[Allocation, ...] | None:
        """What slurmdbd recorded of the job's allocations: each attempt of a requeued job
        (``--duplicates``: without it sacct shows the newest alone), each task of an array;
        None without accounting."""
        done = self._call(
            "sacct", "-j", checked_job_id(job_id), "-X", "--duplicates", "-n", "-P",
            "-o", ALLOCATION_FIELDS,
        )  # fmt: skip
        return parse_allocations(job_id, done.stdout) if done.returncode == 0 else None

    def accounting_works(self) -> bool:
        return self._call("sacct", "--noheader", "-X", "--starttime", "now").returncode == 0

    def batch_script(self, job_id: str) -> str:
        """The batch script as Slurm stored it at submission."""
        done = self._call("scontrol", "write", "batch_script", checked_job_id(job_id), "-")
        if done.returncode != 0:
            raise UserError(
                f"scontrol write batch_script {job_id}: {_first_error_line(done.stderr)}"
            )
        return done.stdout
