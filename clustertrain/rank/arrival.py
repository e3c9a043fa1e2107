"""Who came to the rendezvous: every rank says so in the store, then waits for the others under
the short rendezvous timeout, before the process group is built.

Why a step of its own: ``torch.distributed.init_process_group`` waits for the absent ranks of
a gloo group under its ``timeout`` (gloo's full-mesh connect waits for each peer's address with
the group's timeout, whatever the store's), and that one value is also every collective's. The
collectives need minutes; a rank that never came must fail the job in seconds. Measured with
torch 2.14: a group of 3 under torchrun whose rank 2 never called it still waited after 20 s
with the store at 5 s and the group at 600 s; with the group at 5 s it failed in 5 s naming the
key of rank 2 only. Here the ranks that came are known by name, so the error says who did not.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import TYPE_CHECKING

from clustertrain import protocol

if TYPE_CHECKING:
    import torch.distributed

# A worker group started again by its launcher (torchrun --max_restarts) finds the keys of the
# round before in the launcher's store: each round has its own.
_PREFIX = "clustertrain/arrived/{round}/"
_SETTLE_S = 2.0  # for a rank that counted itself in but has not written its name yet


def wait_for_all(
    store: torch.distributed.Store,
    rank: int,
    world_size: int,
    local_world_size: int,
    timeout_s: float,
) -> str | None:
    """Count this rank in and wait for every rank within ``timeout_s``: None once all came,
    else what the ranks that came know of those that did not (``rank 3 (on node2) never joined
    the rendezvous within 15 s; ranks 0-2 came``)."""
    prefix = _PREFIX.format(round=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    group, host = rank // max(1, local_world_size), node_name()
    # The order of arrival names a slot; the last slot exists once every rank came.
    slot = int(store.add(f"{prefix}count", 1)) - 1
    store.set(f"{prefix}slot/{slot}", f"{rank} {group} {host}")
    try:
        store.wait([f"{prefix}slot/{world_size - 1}"], timedelta(seconds=timeout_s))
        return None
    except RuntimeError:  # torch's DistStoreError: the wait timed out
        pass
    came = {**_came(store, prefix), rank: (group, host)}
    absent = [r for r in range(world_size) if r not in came]
    if not absent:  # the last rank came as the wait ended
        return None
    hosts = {came_group: host for came_group, host in came.values()}
    groups = sorted({r // max(1, local_world_size) for r in absent})
    where = ", ".join(
        f"on {hosts[g]}" if g in hosts else f"the node of GROUP_RANK {g}, none of whose ranks came"
        for g in groups
    )
    return (
        f"{protocol.rank_list(absent)} ({where}) never joined the rendezvous within "
        f"{timeout_s:g} s; {protocol.rank_list(came)} came: the absent ones did not start, or "
        "stopped before init_process_group"
    )


def node_name() -> str:
    """This rank's node as Slurm names it: several slurmd on one host (a test cluster) share
    its host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _came(store: torch.distributed.Store, prefix: str) -> dict[int, tuple[int, str]]:
    """The ranks that came: rank to (its node's group, its host)."""
    count = int(store.add(f"{prefix}count", 0))
    keys = [f"{prefix}slot/{slot}" for slot in range(count)]
    try:
        store.wait(keys, timedelta(seconds=_SETTLE_S))
        # One round trip where torch has it (2.4 on); a get per rank before.
        many = getattr(store, "multi_get", None)
        values = many(keys) if many else [store.get(key) for key in keys]
    except RuntimeError:
        return {}
    came: dict[int, tuple[int, str]] = {}
    for value in values:
        rank, group, host = value.decode("utf-8", "replace").split(" ", 2)
        came[int(rank)] = (int(group), host)
    return came
