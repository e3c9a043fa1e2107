"""Each daemon ready before the next starts, and the whole cluster ready before ``up`` returns:
munged's socket, the database's socket, slurmdbd's port (then its cluster, account and users
registered), every node idle."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

from clustertrain.backends.slurm import Slurm
from clustertrain.errors import UserError

from . import accounting, daemons
from .layout import Layout, clients_dir, conf_path, munge_socket

UP_TIMEOUT_S = 60.0
DAEMON_TIMEOUT_S = 30.0


def slurm(state_dir: Path) -> Slurm:
    """Slurm's commands, bound to this cluster's slurm.conf (and its Slurm's, when that is not
    this host's)."""
    clients = clients_dir(state_dir)
    return Slurm(conf=conf_path(state_dir), bin_dir=clients if clients.is_dir() else None)


def after_start(name: str, layout: Layout, proc: dict) -> None:
    """Wait until the daemon ``name`` just started (``proc``) serves what the next needs."""
    d = layout.state_dir
    if name == "munged":
        _wait(lambda: munge_socket(d).exists(), proc, "munged", 10.0)
    elif name == "mariadb":
        _wait(lambda: accounting.db_socket(d).is_socket(), proc, "mariadbd")
    elif name == "slurmctld":  # answering; its nodes may be busy (a restart mid-job)
        _wait(lambda: bool(slurm(d).node_states()), proc, "slurmctld", UP_TIMEOUT_S)
    elif name == "slurmdbd":
        _wait(lambda: _listening(layout.controller_address, layout.dbd_port), proc, "slurmdbd")
        accounting.register(layout, accounting.users_to_register())


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), 0.5):
            return True
    except OSError:
        return False


def _wait(
    ready: Callable[[], bool], proc: dict, name: str, timeout_s: float = DAEMON_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if not daemons.alive(proc) or time.monotonic() > deadline:
            raise UserError(f"{name} did not start; {daemons.tail(proc['log'])}")
        time.sleep(0.05)


def wait_until_idle(layout: Layout, record: dict) -> None:
    """Every node idle in Slurm's eyes, or a :class:`UserError` saying which is not and why."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        dead = [p for p in record["processes"] if not daemons.alive(p)]
        if dead:
            raise UserError(
                f"{dead[0]['name']} exited during start-up; {daemons.tail(dead[0]['log'])}"
            )
        states = slurm(layout.state_dir).node_states()
        if states and all(states.get(n) == "idle" for n in layout.node_names):
            return
        time.sleep(0.2)
    if not states:
        raise UserError(
            f"slurmctld did not answer within {UP_TIMEOUT_S:.0f} s; "
            f"{daemons.tail(layout.state_dir / 'log' / 'slurmctld.log')}"
        )
    node = next(n for n in layout.node_names if states.get(n) != "idle")
    log = layout.state_dir / "log" / f"slurmd-{node}.log"
    raise UserError(
        f"{node} is {states.get(node, 'missing')}, not idle, after "
        f"{UP_TIMEOUT_S:.0f} s; {daemons.tail(log)}"
    )
