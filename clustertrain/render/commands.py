"""Commands as lists: what srun and each node's launcher run, each word data, the few that the
node's shell must expand marked :class:`Expand` (TorchX's ``_noquote``)."""

from __future__ import annotations

import re
import shlex

from clustertrain import protocol
from clustertrain.spec import JobSpec


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


def srun_argv(spec: JobSpec, *command: str, options: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``command`` once per node; ``--kill-on-bad-exit`` ends the step when any node fails;
    ``options`` (a container's) go before the command.

    The job's CPU request again (``--cpus-per-task`` or ``--cpus-per-gpu``, as sbatch was
    asked; never both, which srun refuses as sbatch does): srun of Slurm 22.05-23.02 does not
    inherit ``--cpus-per-task`` from sbatch, and where CPUs are bound the step would get one
    CPU for every rank of the node. ``--cpus-per-gpu`` it would read from the job's
    ``SLURM_CPUS_PER_GPU``; said here too, so the step's request reads whole in the plan.

    With spare nodes, on the nodes the batch script chose, and ``--overlap``: a step with a lost
    node holds its resources on the others until Slurm declares that node down (SlurmdTimeout),
    and the step that replaces it must not wait for that.
    """
    chosen: tuple[str, ...] = ()
    if spec.spare_nodes:
        chosen = ("--overlap", Expand(f"--nodelist=${protocol.ENV_ACTIVE_NODES}"))
    return (
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={spec.nodes}",
        f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1",
        spec.cpus.flag,
        *chosen,
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
            # Under Slurm the batch script restarts a failed step (max_restarts), with a fresh
            # rendezvous on every node: a launcher's own restart of its workers does not
            # reconnect gloo across nodes reliably.
            "--max_restarts",
            "0",
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
            "--max_restarts=0",  # the batch script restarts the step (above)
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
