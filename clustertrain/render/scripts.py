"""The pure core: a validated :class:`JobSpec` becomes the exact scripts Slurm will run.

No I/O happens here. The dry run prints a :class:`RenderedJob`; a submission writes the same
object to the run folder and hands its batch script to sbatch, so the two cannot disagree.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.render import container
from clustertrain.render.templates import render_template
from clustertrain.spec import JobSpec, sbatch, sweep
from clustertrain.version import __version__

BATCH_SCRIPT, LAUNCH_SCRIPT = "job.sbatch", "launch.sh"


class Expand(str):
    """A word the shell must expand on the node at run time, e.g. ``$HEAD_NODE:$RDZV_PORT``.

    Rendered inside double quotes, so it may hold variable references and plain text only.
    """

    _SAFE = re.compile(r'(?:\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*\}|[^$`"\\\n])*')

    def __new__(cls, text: str) -> Expand:
        if not cls._SAFE.fullmatch(text):
            raise ValueError(f"not a plain variable expansion: {text!r}")
        return super().__new__(cls, text)


def shell_word(word: str) -> str:
    return f'"{word}"' if isinstance(word, Expand) else shlex.quote(word)


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
    # An OCI job's bundle configuration (clustertrain.container.oci_config), else None.
    container_config: str | None = None

    @property
    def batch_path(self) -> str:
        return str(PurePosixPath(self.run_dir, BATCH_SCRIPT))

    @property
    def launch_path(self) -> str:
        return str(PurePosixPath(self.run_dir, LAUNCH_SCRIPT))

    def dry_run_text(self) -> str:
        """What ``submit --dry-run`` prints: both files, each under a line naming its path."""
        text = prepare_text(self.spec, self.workdir) + (
            f"#### {self.batch_path} (handed to sbatch)\n{self.batch_script}"
            f"#### {self.launch_path} (run by srun on every node)\n{self.launch_script}"
        )
        if self.container_config is not None:
            text += (
                f"#### {container.bundle_path(self.run_dir)}/config.json (the OCI bundle srun "
                f"--container runs; its rootfs/ is empty, the image is mounted on it)\n"
                f"{self.container_config}"
            )
        table = sweep.tasks(self.spec.sweep)
        if table:
            text += f"#### the sweep: {len(table)} array tasks ({sweep.TABLE})\n" + "".join(
                f"task {k}: {sweep.describe(params)}\n" for k, params in enumerate(table)
            )
        return text


def prepare_text(spec: JobSpec, workdir: str) -> str:
    """What the dry run shows of the prepare step (clustertrain.backends.prepare): one command a
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
        container_config=container.oci_config(spec, run_dir, workdir),
    )


_NODECHECK = ("python", "-m", "clustertrain.nodecheck")


def _context(
    spec: JobSpec, run_dir: str, workdir: str, launch_argv: tuple[str, ...]
) -> dict[str, Any]:
    """What the templates are given besides the directives; every shell value pre-quoted.

    A sweep's task works in ``$TASK_DIR`` (``tasks/K`` of the run folder) and passes its own
    arguments (``$TASK_ARGS``) to the launch script, which appends them to the launcher's."""
    folder = Expand("$TASK_DIR") if spec.sweep else run_dir
    tasks = [
        (k, " ".join(shlex.quote(w) for w in sweep.task_args(params)))
        for k, params in enumerate(sweep.tasks(spec.sweep))
    ]
    lines = _argv_lines(launch_argv) + (['"$@"'] if spec.sweep else [])
    node_check_dir = Expand(f"$LOG_DIR/{protocol.NODE_CHECK_DIR}")
    return {
        "version": __version__,
        "spec": spec,
        "batch_path": str(PurePosixPath(run_dir, BATCH_SCRIPT)),
        "launch_path": str(PurePosixPath(run_dir, LAUNCH_SCRIPT)),
        "tasks_dir": shlex.quote(str(PurePosixPath(run_dir, sweep.TASKS_DIR))),
        "sweep_tasks": tasks,
        "logs_dir": shell_word(
            Expand(f"{folder}/{protocol.LOGS_DIR}")
            if spec.sweep
            else str(PurePosixPath(run_dir, protocol.LOGS_DIR))
        ),
        "rank_env": [(k, shell_word(v)) for k, v in rank_environment(spec, folder)],
        "offline_env": OFFLINE_ENV if spec.offline else (),
        "protocol": protocol,
        "srun": _step(
            srun_argv(
                spec,
                *container.command_prefix(spec, run_dir, workdir),
                "bash",
                str(PurePosixPath(run_dir, LAUNCH_SCRIPT)),
                options=container.srun_options(spec, run_dir, workdir),
            )
        ),
        "node_check_dir": node_check_dir,
        "node_check": _step(srun_argv(spec, *_NODECHECK, "probe", node_check_dir))
        if spec.node_check
        else "",
        "container_env": [(k, shlex.quote(v)) for k, v in spec.container_env],
        "launch_lines": lines,
    }


def _step(argv: tuple[str, ...]) -> str:
    """An srun line of the batch script, each word quoted unless marked for expansion."""
    return " ".join(shell_word(w) for w in argv)


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
            PurePosixPath(run_dir, sweep.TASKS_DIR, "%a", protocol.LOGS_DIR),
            "slurm-%A_%a",
        )
    gpus = spec.gpus_per_node
    values: dict[str, str | None] = {
        "job-name": spec.name,
        "nodes": str(spec.nodes),
        "ntasks-per-node": "1",
        "cpus-per-task": str(spec.cpus_per_task),
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
        "mail-type": spec.mail_type,
        "mail-user": spec.mail_user,
        "dependency": spec.dependency,
        "array": _array(spec),
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


def rank_environment(
    spec: JobSpec, run_dir: str, requeue: bool = True
) -> tuple[tuple[str, str], ...]:
    """What clustertrain gives every rank besides the venv and ``spec.env``: the batch script
    exports these, and a local run (:mod:`clustertrain.backends.local`, ``requeue=False``) sets
    them.

    ``run_dir`` may be an :class:`Expand` (a sweep task's ``$TASK_DIR``); paths under it are too.
    """

    def under(name: str) -> str:
        if isinstance(run_dir, Expand):
            return Expand(f"{run_dir}/{name}")
        return str(PurePosixPath(run_dir, name))

    pairs = [
        ("PYTHONUNBUFFERED", "1"),
        (protocol.ENV_RUN_DIR, run_dir),
        (protocol.ENV_OUT_DIR, under(protocol.OUT_DIR)),
        (protocol.ENV_EVENTS_FILE, under(protocol.EVENTS_FILE)),
    ]
    if requeue:
        pairs.append((protocol.ENV_REQUEUE_FILE, under(protocol.REQUEUE_FILE)))
    pairs += [
        (protocol.ENV_RDZV_TIMEOUT_S, str(spec.rdzv_timeout_s)),
        # torchrun and accelerate expand ${rank} themselves and prefix each of a rank's lines.
        (protocol.ENV_RANK_PREFIX, protocol.RANK_PREFIX_TEMPLATE),
    ]
    if spec.socket_ifname:
        pairs += [(name, spec.socket_ifname) for name in protocol.SOCKET_IFNAME_VARS]
    return tuple(pairs)


# What ``offline: true`` exports, unless already set: the switches that keep Hugging Face's hub,
# datasets and transformers and W&B from waiting on network timeouts on nodes without a route.
OFFLINE_ENV = (
    ("HF_HUB_OFFLINE", "1"),
    ("HF_DATASETS_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("WANDB_MODE", "offline"),
)


def srun_argv(spec: JobSpec, *command: str, options: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``command`` once per node; ``--kill-on-bad-exit`` ends the step when any node fails;
    ``options`` (a container's) go before the command.

    ``--cpus-per-task`` again: srun of Slurm 22.05-23.02 does not inherit it from sbatch, and
    where CPUs are bound the step would get one CPU for every rank of the node.
    """
    return (
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={spec.nodes}",
        f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={spec.cpus_per_task}",
        *options,
        *command,
    )


def launcher_argv(spec: JobSpec, standalone_port: int | None = None) -> tuple[str, ...]:
    """The command each node runs: ``torchrun`` or ``accelerate launch`` with a c10d rendezvous;
    with ``standalone_port``, the one command a local run starts for the whole world here."""
    if standalone_port is not None:
        return (*_standalone_launcher(spec, standalone_port), *spec.entrypoint, *spec.args)
    if spec.launcher == "accelerate":
        head: tuple[str, ...] = ("accelerate", "launch")
        if spec.world_size > 1:
            head += ("--multi_gpu",)
        head += (
            "--num_machines",
            str(spec.nodes),
            "--num_processes",
            str(spec.world_size),
            # Each node's rank must come from that node at run time: a number rendered here
            # would give every node the same rank.
            "--machine_rank",
            Expand("$SLURM_NODEID"),
            "--main_process_ip",
            Expand("$HEAD_NODE"),
            "--main_process_port",
            Expand("$RDZV_PORT"),
            "--rdzv_backend",
            "c10d",
            "--rdzv_conf",
            Expand(f"join_timeout={spec.rdzv_timeout_s},is_host=$RDZV_IS_HOST"),
            "--max_restarts",
            str(spec.max_restarts),
            "--tee",
            "3",
        )
    else:
        # The underscore spellings: torchrun before torch 2.0 knows no other, and container
        # images carry old ones (Debian 12's python3-torch is 1.13).
        head = (
            "torchrun",
            f"--nnodes={spec.nodes}",
            f"--nproc_per_node={spec.nproc_per_node}",
            "--rdzv_backend=c10d",
            Expand("--rdzv_endpoint=$HEAD_NODE:$RDZV_PORT"),
            Expand("--rdzv_id=$SLURM_JOB_ID"),
            Expand(f"--rdzv_conf=join_timeout={spec.rdzv_timeout_s},is_host=$RDZV_IS_HOST"),
            f"--max_restarts={spec.max_restarts}",
            "--tee=3",
        )
    return (*head, *spec.entrypoint, *spec.args)


def _standalone_launcher(spec: JobSpec, port: int) -> tuple[str, ...]:
    world = spec.world_size
    if spec.launcher == "accelerate":
        head: tuple[str, ...] = ("accelerate", "launch")
        head += ("--multi_gpu",) if world > 1 else ()
        head += ("--num_machines", "1", "--num_processes", str(world))
        return (*head, "--main_process_port", str(port), "--max_restarts", str(spec.max_restarts),
                "--tee", "3")  # fmt: skip
    return ("torchrun", "--standalone", "--nnodes=1", f"--nproc_per_node={world}",
            f"--max_restarts={spec.max_restarts}", "--tee=3")  # fmt: skip


def venv_environment(venv: str | None, base: Mapping[str, str]) -> dict[str, str]:
    """``VIRTUAL_ENV`` and ``PATH`` as the batch script exports them for ``venv`` (nothing
    without one), for what runs outside it: a local run's ranks, the prepare step."""
    if not venv:
        return {}
    return {"VIRTUAL_ENV": venv, "PATH": f"{venv}/bin:{base.get('PATH', '')}"}
