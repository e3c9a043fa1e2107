"""The job spec: what a user asks for, from a YAML job file and command-line flags.

Everything a spec holds has been validated here, in one place, so the renderer can trust it.
Values are data: a field that reaches the shell is either restricted to what Slurm accepts or
quoted literally by the renderer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clustertrain.errors import FieldError
from clustertrain.spec import fields, resources
from clustertrain.spec import nodes as node_checks
from clustertrain.spec.fields import ContainerRuntime, Launcher
from clustertrain.spec.lines import shell_lines
from clustertrain.spec.sweep import MAX_TASKS as MAX_SWEEP_TASKS
from clustertrain.spec.sweep import Sweep
from clustertrain.spec.sweep import parse as parse_sweep


def _field(
    default: Any,
    check: Callable[[str, Any], Any],
    help: str,
    *,
    flag: str | None = "",
    metavar: str | None = None,
    default_text: str | None = None,
    from_flag: Callable[[str], Any] | None = None,
) -> Any:
    """A spec field with everything the job file, the flags and the docs need, said once:
    its ``check`` (clustertrain.spec.fields), its ``help``, and its flag where the name alone is not
    it (``flag=None``: no flag). The CLI builds its options from these (clustertrain.cli.options)
    and adds the default to the help from ``default``, or ``default_text`` where it is derived.
    ``from_flag`` turns one flag value into what a job file would hold."""
    meta = {"check": check, "help": help, "flag": flag, "metavar": metavar}
    meta |= {"default_text": default_text, "from_flag": from_flag}
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class JobSpec:
    """A validated multi-node training job. Build it with :func:`clustertrain.spec.build_spec`."""

    name: str = _field(
        None, fields.optional_name, "Slurm job name, and the start of the run folder's name.",
        default_text="the script's or module's name",
    )  # fmt: skip
    nodes: int = _field(
        1, fields.int_range(1, 10_000), "Nodes to allocate (one launcher per node)."
    )
    gpus_per_node: int = _field(0, fields.int_range(0, 64), "GPUs per node; one process per GPU.")
    procs_per_node: int | None = _field(
        None,
        fields.optional_int(1, 256),
        "Processes per node when it differs from the GPUs (CPU-only nodes).",
        default_text="one per GPU, at least 1",
    )
    gpus_as_gres: bool = _field(
        False, fields.boolean, "Ask for GPUs as --gres=gpu:N (sites without --gpus-per-node).",
        flag="--gres",
    )  # fmt: skip
    # CPUs and memory: per node, or per GPU; one of each pair (clustertrain.spec.resources).
    cpus_per_task: int | None = _field(
        None, fields.optional_int(1, 4096),
        "CPUs for each node's launcher task, shared by its processes.",
        default_text="cpus_per_gpu with GPUs; without, 2 per process, at least 4",
    )  # fmt: skip
    cpus_per_gpu: int | None = _field(
        None, fields.optional_int(1, 256),
        "CPUs per GPU (Slurm's --cpus-per-gpu; not with cpus_per_task).",
        default_text=f"{resources.DEFAULT_CPUS_PER_GPU} with GPUs, fitted to the partition's "
        "nodes at submission",
    )  # fmt: skip
    time: str = _field("01:00:00", fields.time_limit, "Time limit, e.g. 01:30:00 or 2-00:00:00.")
    launcher: Launcher = _field("torchrun", fields.launcher, "torchrun or accelerate.")
    # What each process runs: a script path, or a module run as `python -m` (one of the two).
    script: str | None = _field(
        None, fields.script, "Training script every process runs, e.g. train.py."
    )
    module: str | None = _field(
        None, fields.module, "Python module every process runs as `python -m`, e.g. pkg.train."
    )
    args: tuple[str, ...] = _field(
        (), fields.words, "Arguments of the training script (after -- on the command line).",
        flag=None,
    )  # fmt: skip
    # The number that says how the job did, read from its events (runtime.log_metrics): status,
    # results, a sweep's order and plot show it. None: the job names none, and they show none.
    metric: str | None = _field(
        None, fields.metric,
        "The job's headline metric, as the script logs it (e.g. test_acc, val_loss): status, "
        "results, a sweep's best-first order and plot show it.",
    )  # fmt: skip
    metric_mode: str = _field(
        "max", fields.metric_mode, "Which way the headline metric is better: max or min."
    )
    # Commands run on the submit host, in the submit directory, before anything is queued
    # (clustertrain.pipeline.prepare): compute nodes often have no route out, login nodes do.
    prepare: tuple[tuple[str, ...], ...] = _field(
        (),
        fields.commands,
        "A command run here, in this directory, before queueing (split like a shell line, "
        "never run by one; repeatable; replaces the job file's).",
        metavar="'CMD ARG...'",
        from_flag=fields.split_words,
    )
    offline: bool = _field(
        False,
        fields.boolean,
        "Keep Hugging Face and W&B off the network inside the job (HF_HUB_OFFLINE=1...).",
    )
    # Relayed from the submit side while `logs --follow` follows (clustertrain.track): the
    # nodes need no route to the tracker.
    track: tuple[str, ...] = _field(
        (), fields.trackers,
        "A tracker that `logs --follow` relays the job's records to while it follows: "
        "tensorboard, mlflow (at $MLFLOW_TRACKING_URI) or wandb (repeatable); see "
        "`clustertrain track`.", metavar="TRACKER",
    )  # fmt: skip
    env: tuple[tuple[str, str], ...] = _field(
        (), fields.env_mapping, "Environment variable for the job (repeatable).",
        metavar="KEY=VALUE",
    )  # fmt: skip
    # Lines of the user's own shell (clustertrain.spec.lines): the batch script runs `setup`
    # before the supervisor, each node's launch script runs `node_setup` before its launcher.
    setup: tuple[str, ...] = _field(
        (), shell_lines,
        "A shell line the batch script runs before any step, e.g. 'module load cuda/12.1' "
        "(repeatable; adds to the job file's).", metavar="LINE",
    )  # fmt: skip
    node_setup: tuple[str, ...] = _field(
        (), shell_lines,
        "A shell line every node runs before its launcher starts, e.g. 'ulimit -n 65536' "
        "(repeatable; adds to the job file's).", metavar="LINE",
    )  # fmt: skip
    partition: str | None = _field(None, fields.partition, "Slurm partition.")
    account: str | None = _field(None, fields.account, "Slurm account to charge.")
    qos: str | None = _field(None, fields.qos, "Slurm quality of service.")
    constraint: str | None = _field(
        None, fields.constraint, "Node features the job needs, e.g. 'a100&ib'."
    )
    exclusive: bool = _field(False, fields.boolean, "Whole nodes for this job.")
    mem: str | None = _field(
        None, fields.mem, "Memory per node, e.g. 64G.", default_text="the cluster's"
    )
    mem_per_gpu: str | None = _field(
        None, resources.mem_per_gpu, "Memory per GPU, e.g. 32G (Slurm's --mem-per-gpu; not "
        "with mem).", default_text="the cluster's",
    )  # fmt: skip
    mail_type: str | None = _field(None, fields.mail_type, "When Slurm mails, e.g. END,FAIL.")
    mail_user: str | None = _field(None, fields.mail_user, "Who Slurm mails.")
    dependency: str | None = _field(None, fields.dependency, "e.g. afterok:1234")
    sbatch_options: tuple[str, ...] = _field(
        (), fields.sbatch_options, "Any other sbatch option, passed through (repeatable).",
        flag="--sbatch-option", metavar="--OPT=VALUE",
    )  # fmt: skip
    signal_lead_s: int = _field(
        120, fields.int_range(10, 65535),
        "Seconds before the time limit at which the job is warned (USR2).", flag="--signal-lead",
    )  # fmt: skip
    max_restarts: int = _field(
        0, fields.int_range(0, 100),
        "Restarts of a failed or hung step inside the allocation, from the last checkpoint "
        "(a local run: the launcher's restarts of its workers).",
    )  # fmt: skip
    # A restart storm (clustertrain.node.policy): restarts that keep failing before the script
    # records a new checkpoint (its ``checkpoint`` event) are ended, however many are left.
    storm_restarts: int = _field(
        3, fields.int_range(0, 100),
        "Restarts in a row that never get past the last checkpoint before the job stops "
        "restarting (restart storm); 0: max_restarts alone bounds them.",
    )  # fmt: skip
    max_requeues: int = _field(3, fields.int_range(0, 100), "Requeues after a checkpoint.")
    # A node lost mid-job: requeue (without it, from the last checkpoint) instead of ending.
    requeue_on_node_failure: bool = _field(
        False, fields.boolean, "A node lost mid-job: requeue without it and resume."
    )
    # Nodes held beside ``nodes`` (--no-kill): a node lost mid-step is replaced by one of them
    # inside the allocation, found by the batch script's own roll call (clustertrain.node.rollcall).
    spare_nodes: int = _field(
        0, fields.int_range(0, 64),
        "Extra nodes held in the allocation: a node lost mid-step is replaced by a spare and the "
        "step starts again from the last checkpoint, without a requeue.",
    )  # fmt: skip
    node_check: bool = _field(
        True, fields.boolean, "Check every node's view of the head node before training."
    )
    # Qualification (clustertrain.node.qualify): a timed matmul on each node and pairwise-quick
    # link probes between them, with the job's own collective backend, before training. Left
    # out (None), __post_init__ turns it on with spare_nodes (spec.nodes.qualifies): a spec
    # always holds true or false.
    qualify: bool = _field(
        None, node_checks.qualify,
        "Before training, time a fixed matmul on every node and a fixed exchange between node "
        "pairs; a node slower than the median by more than compute_threshold or "
        "link_threshold is flagged, and swapped for a spare if one is left.",
        default_text="on with spare_nodes, else off",
    )  # fmt: skip
    # The defaults come from the measured spread of healthy nodes (docs/qualification.md).
    compute_threshold: float = _field(
        2.0, node_checks.ratio(1.0, 1000.0),
        "How many times slower than the allocation's median a node's matmul may be before it "
        "is flagged.", metavar="X",
    )  # fmt: skip
    link_threshold: float = _field(
        10.0, node_checks.ratio(1.0, 1000.0),
        "How many times slower than the allocation's median a node's best link may be before "
        "it is flagged.", metavar="X",
    )  # fmt: skip
    on_flagged: str = _field(
        "fail", node_checks.on_flagged,
        "A flagged node with no spare left to replace it: fail (end the job before training, "
        "naming it) or warn (train on it, and say so).",
    )  # fmt: skip
    # Stragglers (clustertrain.node.straggler): a node whose ranks' timed work (runtime.compute(),
    # runtime.time_forward()) stays slower than the other nodes' by this many times is named
    # (and with replace, swapped).
    straggler_threshold: float = _field(
        2.0, node_checks.ratio(1.0, 1000.0),
        "How many times slower than the other nodes' a node's compute time (runtime.time_forward, "
        "runtime.compute) may stay before it is named a straggler.", metavar="X",
    )  # fmt: skip
    straggler_action: str = _field(
        "warn", node_checks.straggler_action,
        "A straggler is named (warn), or with a spare node swapped for it at the next "
        "checkpoint (replace).",
    )  # fmt: skip
    exclude: tuple[str, ...] = _field(
        (), node_checks.node_names, "A node this job must not get (repeatable).", metavar="NODE"
    )
    avoid_bad_nodes: bool = _field(
        True, fields.boolean,
        "Exclude the nodes your node record holds (flagged or lost in earlier jobs; "
        "`clustertrain nodes`).",
    )  # fmt: skip
    # A step whose ranks call runtime.heartbeat and none of which made progress for this long
    # is hung: clustertrain.node.watchdog saves their stacks, names them and ends the step.
    hang_timeout_s: int = _field(
        1800, fields.int_range(10, 7 * 24 * 3600),
        "Seconds without progress from any rank (runtime.heartbeat) after which the step is "
        "declared hung: stacks saved, ranks named, the step ended.", flag="--hang-timeout",
    )  # fmt: skip
    hang_on_quiet: bool = _field(
        False, fields.boolean,
        "Also count the job's output as progress, for scripts that do not call "
        "runtime.heartbeat: quiet for hang_timeout_s is a hang (stacks by py-spy).",
    )  # fmt: skip
    rdzv_timeout_s: int = _field(
        120, fields.int_range(10, 3600),
        "Seconds the rendezvous and the first all-reduce may take.", flag="--rdzv-timeout",
    )  # fmt: skip
    # The interface(s) gloo and NCCL use; None: each node's route to the head node decides.
    socket_ifname: str | None = _field(
        None, fields.socket_ifname, "Interface(s) for gloo and NCCL, e.g. ib0.",
        default_text="each node's route to the head node",
    )  # fmt: skip
    venv: str | None = _field(
        None, fields.venv, "Virtual environment the nodes use.", default_text="the current one"
    )
    # A job array: each task this job with one combination of values (clustertrain.spec.sweep).
    sweep: Sweep = _field(
        (), parse_sweep,
        "A job array: each task passes --NAME V; the tasks are the product (repeatable).",
        metavar="NAME=V1,V2",
    )  # fmt: skip
    max_parallel: int | None = _field(
        None, fields.optional_int(1, MAX_SWEEP_TASKS), "Tasks of a sweep that may run at once.",
        default_text="all",
    )  # fmt: skip
    # The image the launcher and its ranks run in; the batch shell stays on the host
    # (clustertrain.render.container).
    container_image: str | None = _field(
        None,
        fields.container_image,
        "Image the launcher and its ranks run in (pyxis: a name or .sqsh; apptainer: a .sif; "
        "oci: a root filesystem folder).",
    )
    container_runtime: ContainerRuntime | None = _field(
        None, fields.container_runtime, "pyxis, apptainer or oci (Slurm's srun --container)."
    )
    container_mounts: tuple[str, ...] = _field(
        (), fields.container_mounts,
        "Another folder to mount in the container (repeatable; the run folder and the working "
        "directory always are).", flag="--container-mount", metavar="SRC[:DST[:ro]]",
    )  # fmt: skip
    container_env: tuple[tuple[str, str], ...] = _field(
        (), fields.container_env, "Environment variable set inside the container only "
        "(repeatable).", metavar="KEY=VALUE",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.script is None and self.module is None:
            raise FieldError(
                "module", None, "name what every process runs: a script (--script train.py) or "
                "a module (--module pkg.train), in a job file or as a flag",
            )  # fmt: skip
        if self.name is None:
            object.__setattr__(self, "name", fields.name_from(self.script or self.module or ""))
        object.__setattr__(self, "qualify", node_checks.qualifies(self.qualify, self.spare_nodes))
        if self.max_parallel is not None and not self.sweep:
            raise FieldError("max_parallel", self.max_parallel, "only applies to a sweep")
        self._check_container()
        resources.check(self)

    def _check_container(self) -> None:
        if self.container_image is None:
            for name in ("container_runtime", "container_mounts", "container_env"):
                if getattr(self, name):
                    raise FieldError(name, getattr(self, name), "needs a container_image")
        elif self.container_runtime is None:
            raise FieldError(
                "container_runtime",
                None,
                "name the runtime that runs container_image: pyxis, apptainer or oci",
            )
        elif self.container_runtime == "oci" and not self.container_image.startswith("/"):
            raise FieldError(
                "container_image",
                self.container_image,
                "for oci, must be the absolute path of the image's root filesystem folder",
            )

    @property
    def cpus(self) -> resources.CpuRequest:
        """What Slurm is asked for CPUs (per node or per GPU), and each node's CPUs."""
        return resources.cpu_request(self)

    @property
    def threads_per_process(self) -> int:
        """OMP_NUM_THREADS for each rank: the task's CPUs split over the node's processes."""
        return max(1, self.cpus.per_node // self.nproc_per_node)

    @property
    def nproc_per_node(self) -> int:
        """Processes each node starts: one per GPU unless set, at least one on CPU-only nodes."""
        return self.procs_per_node or max(self.gpus_per_node, 1)

    @property
    def allocated_nodes(self) -> int:
        """The nodes the job holds: those it trains on and its spares."""
        return self.nodes + self.spare_nodes

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def entrypoint(self) -> tuple[str, ...]:
        """What follows the launcher's own options: ``SCRIPT`` or ``-m MODULE``."""
        return ("-m", self.module) if self.module is not None else (str(self.script),)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a job file would hold it (what a run folder records)."""
        data = {name: getattr(self, name) for name in FIELDS}
        data["args"] = list(self.args)
        data["prepare"] = [list(command) for command in self.prepare]
        data["env"] = dict(self.env)
        data["setup"], data["node_setup"] = list(self.setup), list(self.node_setup)
        data["sbatch_options"] = list(self.sbatch_options)
        data["sweep"] = {name: list(values) for name, values in self.sweep}
        data["container_mounts"] = list(self.container_mounts)
        data["track"] = list(self.track)
        data["exclude"] = list(self.exclude)
        data["container_env"] = dict(self.container_env)
        return data


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(JobSpec))
# Each field's check, read from its declaration.
VALIDATORS: dict[str, Callable[[str, Any], Any]] = {
    f.name: f.metadata["check"] for f in dataclasses.fields(JobSpec)
}
