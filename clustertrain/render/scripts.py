"""The pure core: a validated :class:`JobSpec` becomes the exact scripts Slurm will run.

No I/O happens here. The dry run prints a :class:`RenderedJob`; a submission writes the same
object to the run folder and hands its batch script to sbatch, so the two cannot disagree.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.render import container
from clustertrain.render.commands import Expand, launcher_argv, shell_word, srun_argv
from clustertrain.render.environment import OFFLINE_ENV, rank_environment
from clustertrain.render.origins import origins_text
from clustertrain.render.templates import render_template
from clustertrain.spec import JobSpec, sbatch, sweep
from clustertrain.version import __version__

BATCH_SCRIPT, LAUNCH_SCRIPT = "job.sbatch", "launch.sh"
PLAN_FILE = protocol.PLAN_FILE


@dataclass(frozen=True)
class RenderedJob:
    """Everything a submission writes and submits, as text."""

    spec: JobSpec
    run_dir: str
    workdir: str
    directives: tuple[str, ...]
    launch_argv: tuple[str, ...]
    batch_script: str
    launch_script: str
    # What the batch script's supervisor runs and decides (clustertrain.node.supervisor), as JSON.
    plan: str
    # An OCI job's bundle configuration (clustertrain.container.oci_config), else None.
    container_config: str | None = None
    # The nodes the submitter's node record excluded, a line each with why (its --exclude).
    excluded: tuple[str, ...] = ()
    # Where the values given or chosen came from, a (field, where) pair each (the dry run's).
    origins: tuple[tuple[str, str], ...] = ()
    # What clustertrain decided for the job that it did not say (qualification turned on by its
    # spare nodes), a line each, which the dry run says before the scripts.
    notes: tuple[str, ...] = ()

    @property
    def batch_path(self) -> str:
        return str(PurePosixPath(self.run_dir, BATCH_SCRIPT))

    @property
    def launch_path(self) -> str:
        return str(PurePosixPath(self.run_dir, LAUNCH_SCRIPT))

    @property
    def plan_path(self) -> str:
        return str(PurePosixPath(self.run_dir, PLAN_FILE))

    def dry_run_text(self) -> str:
        """What ``submit --dry-run`` prints: both files, each under a line naming its path."""
        text = "".join(f"#### {line}\n" for line in self.notes) + "".join(
            f"#### excluded by your node record (`clustertrain nodes`): {line}\n"
            for line in self.excluded
        )
        text += prepare_text(self.spec, self.workdir) + (
            f"#### {self.batch_path} (handed to sbatch)\n{self.batch_script}"
            f"#### {self.launch_path} (run by srun on every node)\n{self.launch_script}"
            f"#### {self.plan_path} (what the batch script's supervisor runs and decides)\n"
            f"{self.plan}"
        )
        if self.container_config is not None:
            text += (
                f"#### {container.bundle_path(self.run_dir)}/config.json (the OCI bundle srun "
                f"--container runs; its rootfs/ is empty, the image is mounted on it)\n"
                f"{self.container_config}"
            )
        table = sweep.tasks(self.spec.sweep)
        if table:
            text += (
                f"#### the sweep: {len(table)} array tasks ({protocol.SWEEP_TABLE})\n"
                + "".join(f"task {k}: {sweep.describe(params)}\n" for k, params in enumerate(table))
            )
        # Last: what stays on the screen.
        return text + origins_text(self.spec, self.origins)


def prepare_text(spec: JobSpec, workdir: str) -> str:
    """What the dry run shows of the prepare step (clustertrain.pipeline.prepare): one command a
    line, as a shell would read it."""
    if not spec.prepare:
        return ""
    head = f"#### prepare: run in {workdir} before anything is queued (--no-prepare skips it)\n"
    return head + "".join(shlex.join(command) + "\n" for command in spec.prepare)


def render(spec: JobSpec, run_dir: str, workdir: str) -> RenderedJob:
    """Render ``spec`` for a job whose files live in ``run_dir`` and which runs in ``workdir``.

    Both paths must be absolute (every node resolves them the same way).
    """
    for what, path in (("runs dir", run_dir), ("working directory", workdir)):
        if (
            not path.startswith("/")
            or not path.isprintable()
            or "%" in path
            or (sbatch.UNSAFE.search(path))
        ):
            raise UserError(
                f"{what}: {path!r} cannot be given to Slurm (it must be absolute, without '%', "
                "'\"', '\\' or control characters); use another folder"
            )
    if spec.container_runtime in ("pyxis", "apptainer"):
        for what, path in (("runs dir", run_dir), ("working directory", workdir)):
            if "," in path or ":" in path:
                raise UserError(
                    f"{what}: {path!r} cannot be mounted by {spec.container_runtime}, which "
                    "reads ',' and ':' as separators; use a folder without them"
                )
    launch_argv = launcher_argv(spec)
    directives = sbatch_directives(spec, run_dir, workdir)
    context = {
        **_context(spec, run_dir, workdir, launch_argv),
        "directives": directives,
    }
    return RenderedJob(
        spec=spec,
        run_dir=run_dir,
        workdir=workdir,
        directives=directives,
        launch_argv=launch_argv,
        batch_script=render_template("sbatch.sh.j2", **context),
        launch_script=render_template("launch.sh.j2", **context),
        plan=_plan(spec, run_dir, workdir),
        container_config=container.oci_config(spec, run_dir, workdir),
    )


_NODECHECK = ("python", "-m", "clustertrain.node.nodecheck")


def _context(
    spec: JobSpec, run_dir: str, workdir: str, launch_argv: tuple[str, ...]
) -> dict[str, Any]:
    """What the templates are given besides the directives; every shell value pre-quoted.

    A sweep's task works in ``$TASK_DIR`` (``tasks/K`` of the run folder) and passes its own
    arguments (the plan's ``tasks``) to the launch script, which appends them to the
    launcher's."""
    folder = Expand("$TASK_DIR") if spec.sweep else run_dir
    lines = _argv_lines(launch_argv) + (['"$@"'] if spec.sweep else [])
    return {
        "version": __version__,
        "spec": spec,
        "batch_path": str(PurePosixPath(run_dir, BATCH_SCRIPT)),
        "launch_path": str(PurePosixPath(run_dir, LAUNCH_SCRIPT)),
        "plan_path": str(PurePosixPath(run_dir, PLAN_FILE)),
        "tasks_dir": shlex.quote(str(PurePosixPath(run_dir, protocol.TASKS_DIR))),
        "rank_env": [(k, shell_word(v)) for k, v in rank_environment(spec, folder)],
        "offline_env": OFFLINE_ENV if spec.offline else (),
        "protocol": protocol,
        "node_check_dir": _NODE_CHECK_DIR,
        "container_env": [(k, shlex.quote(v)) for k, v in spec.container_env],
        "launch_lines": lines,
        "setup_lines": _numbered(spec.setup),
        "node_setup_lines": _numbered(spec.node_setup),
    }


def _numbered(lines: tuple[str, ...]) -> list[tuple[int, str]]:
    """Each shell line with its number from 1, quoted as one word for ``eval`` and ``printf``:
    bash reads it back as the very text the user wrote (clustertrain.spec.lines)."""
    return [(number, shlex.quote(line)) for number, line in enumerate(lines, 1)]


_NODE_CHECK_DIR = Expand(f"$LOG_DIR/{protocol.NODE_CHECK_DIR}")


def _plan(spec: JobSpec, run_dir: str, workdir: str) -> str:
    """What the supervisor runs (the step and the node check, srun's words with the few it
    expands marked) and the fault-tolerance fields it decides by (clustertrain.node.supervisor)."""
    logs = PurePosixPath(run_dir, protocol.LOGS_DIR)
    step = srun_argv(
        spec,
        *container.command_prefix(spec, run_dir, workdir),
        "bash",
        str(PurePosixPath(run_dir, LAUNCH_SCRIPT)),
        options=container.srun_options(spec, run_dir, workdir),
    )
    check = _check_argv(spec) if spec.node_check or spec.qualify else None
    tasks = {
        str(k): list(sweep.task_args(params)) for k, params in enumerate(sweep.tasks(spec.sweep))
    }
    plan: dict[str, Any] = {
        "step": _plan_words(step),
        "node_check": None if check is None else _plan_words(check),
        "logs_dir": _plan_words((Expand(f"$TASK_DIR/{protocol.LOGS_DIR}"),))[0]
        if spec.sweep
        else str(logs),
        "nodes": spec.nodes,
        "spare_nodes": spec.spare_nodes,
        "hang_timeout_s": spec.hang_timeout_s,
        "hang_on_quiet": spec.hang_on_quiet,
        "max_restarts": spec.max_restarts,
        "storm_restarts": spec.storm_restarts,
        "max_requeues": spec.max_requeues,
        "requeue_on_node_failure": spec.requeue_on_node_failure,
        "tasks": tasks or None,
        "straggler_threshold": spec.straggler_threshold,
        "straggler_action": spec.straggler_action,
    }
    if spec.qualify:
        plan |= {"qualify": True, "compute_threshold": spec.compute_threshold,
                 "link_threshold": spec.link_threshold,
                 "on_flagged": spec.on_flagged}  # fmt: skip
    # A key a line, each value on its line: a person reads it, and a diff shows what changed.
    return (
        "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in plan.items()) + "\n}\n"
    )


def _check_argv(spec: JobSpec) -> tuple[str, ...]:
    """The node check's srun: on the step's nodes; with ``qualify``, on the nodes the supervisor
    names (every node of the allocation, spares too, so that a flagged node is swapped for a
    qualified spare; before a restart, those it still holds), timed. ``--overlap``: a step
    with a lost node holds its CPUs on the others until Slurm declares that node down."""
    if not spec.qualify:
        return srun_argv(spec, *_NODECHECK, "probe", _NODE_CHECK_DIR)
    count = f"${protocol.ENV_CHECK_COUNT}"
    return (
        "srun", "--kill-on-bad-exit=1", "--overlap", Expand(f"--nodes={count}"),
        Expand(f"--ntasks={count}"), "--ntasks-per-node=1",
        spec.cpus.flag, Expand(f"--nodelist=${protocol.ENV_CHECK_NODES}"),
        *_NODECHECK, "probe", _NODE_CHECK_DIR, "--qualify",
    )  # fmt: skip


def _plan_words(argv: tuple[str, ...]) -> list[str | dict[str, str]]:
    """A command for the plan: a word the supervisor expands is ``{"expand": "$VAR..."}``."""
    return [{"expand": str(w)} if isinstance(w, Expand) else w for w in argv]


def _argv_lines(argv: tuple[str, ...]) -> list[str]:
    """Quote ``argv`` and group it one option per line: ``--flag value`` stays together."""
    lines: list[list[str]] = []
    for word in argv:
        takes_value = len(lines) == 1 or (
            lines and lines[-1][0].startswith("-") and "=" not in lines[-1][0]
        )
        if lines and len(lines[-1]) == 1 and takes_value and not word.startswith("-"):
            lines[-1].append(word)
        else:
            lines.append([word])
    return [" ".join(shell_word(w) for w in line) for line in lines]


def sbatch_directives(spec: JobSpec, run_dir: str, workdir: str) -> tuple[str, ...]:
    """The ``#SBATCH`` flags, sorted by name, each value quoted for sbatch's own parser
    (:mod:`clustertrain.spec.sbatch`), which is not bash's."""
    logs = PurePosixPath(run_dir, protocol.LOGS_DIR)
    # %j keeps jobs apart; a sweep's task K (%a of array %A) writes into its own folder.
    log_name = "slurm-%j"
    if spec.sweep:
        logs, log_name = (
            PurePosixPath(run_dir, protocol.TASKS_DIR, "%a", protocol.LOGS_DIR),
            "slurm-%A_%a",
        )
    gpus = spec.gpus_per_node
    values: dict[str, str | None] = {
        "job-name": spec.name,
        "nodes": str(spec.allocated_nodes),
        "ntasks-per-node": "1",
        # Per node or per GPU, never both (clustertrain.spec.resources).
        spec.cpus.option: str(spec.cpus.value),
        "time": spec.time,
        "chdir": workdir,
        # Attempts of a requeued job append instead of overwriting.
        "output": f"{logs}/{log_name}.out",
        "error": f"{logs}/{log_name}.err",
        "open-mode": "append",
        # B: signals the batch shell only; it forwards the warning to the launchers.
        "signal": f"B:{protocol.STOP_SIGNAL}@{spec.signal_lead_s}",
        "partition": spec.partition,
        "account": spec.account,
        "qos": spec.qos,
        "constraint": spec.constraint,
        "mem": spec.mem,
        "mem-per-gpu": spec.mem_per_gpu,
        "mail-type": spec.mail_type,
        "mail-user": spec.mail_user,
        "dependency": spec.dependency,
        "array": _array(spec),
        "exclude": ",".join(spec.exclude) or None,
    }
    if gpus:
        values["gres" if spec.gpus_as_gres else "gpus-per-node"] = (
            f"gpu:{gpus}" if spec.gpus_as_gres else str(gpus)
        )
    # Explicit either way: a site's JobRequeue default would otherwise decide whether Slurm
    # requeues the job when it declares one of its nodes down (NODE_FAIL). srun waits for that
    # verdict: a step with a lost node ends only when Slurm declares the node down.
    switches = ["requeue" if spec.requeue_on_node_failure else "no-requeue"]
    switches += ["exclusive"] if spec.exclusive else []
    # With spares, a lost node must not end the job: the batch script replaces it itself.
    switches += ["no-kill"] if spec.spare_nodes else []
    flags = sorted(
        [f"--{key}={sbatch.quote(value)}" for key, value in values.items() if value is not None]
        + [f"--{switch}" for switch in switches],
        key=lambda flag: flag.split("=")[0],
    )
    for option in spec.sbatch_options:
        key, sep, value = option.partition("=")
        flags.append(f"{key}={sbatch.quote(value)}" if sep else key)
    return tuple(flags)


def _array(spec: JobSpec) -> str | None:
    if not spec.sweep:
        return None
    count = len(sweep.tasks(spec.sweep))
    return f"0-{count - 1}" + (f"%{spec.max_parallel}" if spec.max_parallel else "")
