"""The distributed context of one training process, read once from its environment.

torchrun's variables win (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...); else Slurm's, for a
script started by ``srun`` directly (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``,
``SLURM_NODEID``, head node = first host of ``SLURM_JOB_NODELIST``, port from ``SLURM_JOB_ID``);
else one process. torch is imported inside the functions that need it, so the CLI can import
this module for :func:`rendezvous_port` at no cost.

Example, in a training script::

    from clustertrain import env
    dist_env = env.from_environ()
    env.init_process_group(dist_env)   # fails in ~30 s, naming the variables, if peers are absent
    device = env.pick_device(dist_env)
    ...
    env.destroy_process_group()
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from clustertrain import protocol
from clustertrain.errors import UserError
from clustertrain.rank import arrival

if TYPE_CHECKING:
    import torch

Source = Literal["torchrun", "slurm", "single"]

DEFAULT_RENDEZVOUS_TIMEOUT_S = 30.0
# Collectives may legitimately wait on a slow peer (another node preparing data, rank 0 writing
# a checkpoint), so they get far longer than the rendezvous, but not torch's default 30 min.
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0

_TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
_SLURM_VARS = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NODEID",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class RendezvousError(UserError):
    """The process group could not be formed: a peer or the head node is unreachable."""


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = protocol.PORT_BASE
    source: Source = "single"
    rendezvous_timeout_s: float = DEFAULT_RENDEZVOUS_TIMEOUT_S
    # The variables this was read from, for error messages.
    seen: tuple[tuple[str, str], ...] = ()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0

    def describe(self) -> str:
        seen = " ".join(f"{k}={v}" for k, v in self.seen) or "none"
        return f"rank {self.rank} of {self.world_size} from {self.source} variables ({seen})"


rendezvous_port = protocol.rendezvous_port


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm hostlist: ``node[1-3,5]`` -> node1 node2 node3 node5; ``a1,b[01-02]``.

    Zero padding is kept (``b[08-10]`` -> b08 b09 b10), like ``scontrol show hostnames``.
    Several bracket groups in one name (``r[1-2]n[1-2]``) expand as a cartesian product.
    """
    hosts: list[str] = []
    for item in _split_top_level(hostlist.strip()):
        expanded = [""]
        for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
            parts = _expand_ranges(ranges) if ranges else [""]
            expanded = [head + literal + part for head in expanded for part in parts]
        hosts.extend(expanded)
    return hosts


def _split_top_level(hostlist: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(hostlist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(hostlist[start:i])
            start = i + 1
    items.append(hostlist[start:])
    if depth != 0:
        raise ValueError(f"unbalanced brackets in Slurm hostlist {hostlist!r}")
    return [item for item in items if item]


def _expand_ranges(ranges: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not high:
            out.append(low)
            continue
        width = len(low) if low.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return out


def _tasks_on_node(tasks_per_node: str, node: int) -> int | None:
    """``2(x3),1`` is Slurm's way of writing 2,2,2,1 (sbatch(1), SLURM_TASKS_PER_NODE)."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            return None
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts[node] if node < len(counts) else None


def from_environ(environ: Mapping[str, str] | None = None) -> DistEnv:
    environ = os.environ if environ is None else environ
    try:
        timeout = float(environ.get(protocol.ENV_RDZV_TIMEOUT_S, DEFAULT_RENDEZVOUS_TIMEOUT_S))
        if "RANK" in environ and "WORLD_SIZE" in environ:
            return _from_torchrun(environ, timeout)
        if "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
            return _from_slurm(environ, timeout)
        return DistEnv(rendezvous_timeout_s=timeout)
    except ValueError as exc:
        raise UserError(f"cannot read the distributed context from the environment: {exc}") from exc


def _seen(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((name, environ[name]) for name in names if name in environ)


def _from_torchrun(environ: Mapping[str, str], timeout: float) -> DistEnv:
    world_size = int(environ["WORLD_SIZE"])
    return DistEnv(
        rank=int(environ["RANK"]),
        local_rank=int(environ.get("LOCAL_RANK", "0")),
        world_size=world_size,
        local_world_size=int(environ.get("LOCAL_WORLD_SIZE", str(world_size))),
        node_rank=int(environ.get("GROUP_RANK", "0")),
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(environ.get("MASTER_PORT", protocol.PORT_BASE)),
        source="torchrun",
        rendezvous_timeout_s=timeout,
        seen=_seen(environ, _TORCHRUN_VARS),
    )


def _from_slurm(environ: Mapping[str, str], timeout: float) -> DistEnv:
    # Inside an srun step the step's counts apply; SLURM_NTASKS is the whole allocation's.
    world_size = int(environ.get("SLURM_STEP_NUM_TASKS", environ["SLURM_NTASKS"]))
    node_rank = int(environ.get("SLURM_NODEID", "0"))
    nodes = expand_hostlist(environ.get("SLURM_JOB_NODELIST", "127.0.0.1"))
    tasks_per_node = environ.get("SLURM_STEP_TASKS_PER_NODE", environ.get("SLURM_TASKS_PER_NODE"))
    local_world_size = _tasks_on_node(tasks_per_node, node_rank) if tasks_per_node else None
    job_id = int(environ.get("SLURM_JOB_ID", "0"))
    return DistEnv(
        rank=int(environ["SLURM_PROCID"]),
        local_rank=int(environ.get("SLURM_LOCALID", "0")),
        world_size=world_size,
        local_world_size=local_world_size or max(1, world_size // max(1, len(nodes))),
        node_rank=node_rank,
        # An explicit MASTER_ADDR/MASTER_PORT (as in PyTorch's multinode example) wins.
        master_addr=environ.get("MASTER_ADDR", nodes[0] if nodes else "127.0.0.1"),
        master_port=int(environ.get("MASTER_PORT", rendezvous_port(job_id))),
        source="slurm",
        rendezvous_timeout_s=timeout,
        seen=_seen(environ, _SLURM_VARS),
    )


def pick_device(env: DistEnv) -> torch.device:
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(
    env: DistEnv,
    device: torch.device | None = None,
    timeout_s: float | None = None,
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
) -> None:
    """Join the process group, failing within ``timeout_s`` if the peers are absent.

    ``timeout_s`` defaults to ``env.rendezvous_timeout_s`` ($CLUSTERTRAIN_RDZV_TIMEOUT_S, 30 s).

    The store is built here with the short rendezvous timeout, and every rank waits there for
    the others (:mod:`clustertrain.rank.arrival`, which names those that never came); only then
    is the group built, with the long collective timeout: ``init_process_group(timeout=...)``
    uses one value for both its own wait for absent peers and every collective.
    """
    import torch.distributed as dist

    device = device or pick_device(env)
    if timeout_s is not None:
        env = replace(env, rendezvous_timeout_s=timeout_s)
    absent = None
    try:
        with _native_stderr_silenced():
            store = _rendezvous_store(env)
            if env.world_size > 1:
                absent = arrival.wait_for_all(
                    store, env.rank, env.world_size, env.local_world_size, env.rendezvous_timeout_s
                )
            if absent is None:
                store.set_timeout(timedelta(seconds=collective_timeout_s))
                dist.init_process_group(
                    backend_for(device),
                    store=store,
                    rank=env.rank,
                    world_size=env.world_size,
                    timeout=timedelta(seconds=collective_timeout_s),
                    device_id=device if device.type == "cuda" else None,
                )
    except (RuntimeError, OSError, ValueError) as exc:
        text = str(exc).strip()
        reason = text.splitlines()[0].rstrip(".") if text else type(exc).__name__
        raise RendezvousError(
            f"cannot reach the rendezvous at {env.master_addr}:{env.master_port} within "
            f"{env.rendezvous_timeout_s:g} s as {env.describe()}: {reason[:200]}; check that all "
            f"{env.world_size} processes started and that the head node is reachable"
        ) from exc
    if absent is not None:
        raise RendezvousError(f"rank {env.rank} on {arrival.node_name()}: {absent}")
    _first_all_reduce(env, device)


def _first_all_reduce(env: DistEnv, device: torch.device) -> None:
    """One tiny all-reduce under the short timeout.

    Joining the store only proves every rank reaches the head node; the collectives use direct
    connections between ranks, which a firewall or a wrong interface can break. Without this,
    that shows up as a hang at the first training step, for the long collective timeout.
    """
    import torch
    import torch.distributed as dist

    total = torch.ones(1, device=device)
    reason = "it did not finish"
    try:
        work = dist.all_reduce(total, async_op=True)
        finished = work.wait(timeout=timedelta(seconds=env.rendezvous_timeout_s))
    except RuntimeError as exc:
        finished, reason = False, (str(exc).strip().splitlines() or ["error"])[0][:200]
    if finished is not False and int(total.item()) == env.world_size:
        return
    raise RendezvousError(
        f"rank {env.rank} on {socket.gethostname()}: a first all-reduce across "
        f"{env.world_size} ranks failed within {env.rendezvous_timeout_s:g} s ({reason}); "
        "the ranks reach the head node but not each other: check firewalls and the network "
        "interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)"
    )


def _rendezvous_store(env: DistEnv) -> torch.distributed.Store:
    import torch.distributed as dist

    if env.world_size == 1 and env.source == "single":
        return dist.HashStore()
    # env:// reuses torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE); tcp:// makes rank 0
    # serve the store and wait for all ranks to connect, each within the timeout.
    url = "env://" if env.source == "torchrun" else f"tcp://{env.master_addr}:{env.master_port}"
    timeout = timedelta(seconds=env.rendezvous_timeout_s)
    store, _, _ = next(dist.rendezvous(url, env.rank, env.world_size, timeout=timeout))
    return store


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Hide what c10d's C++ side writes to fd 2 while it connects.

    Each failed connect attempt logs a native stack trace there (TORCH_CPP_LOG_LEVEL is read
    once, when torch loads); the exception that follows says the same in one line.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
