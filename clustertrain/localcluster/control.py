"""The control plane fails too, as at sites: ``cluster fail controller`` stops slurmctld,
``cluster fail accounting`` stops slurmdbd (each by its recorded PID), ``cluster heal ...``
starts it again with the same command line, and ``cluster restart ...`` does both, as an
upgrade does. Jobs keep running on their nodes meanwhile; slurmctld takes them back from its
state folder, slurmctld keeps what it must tell slurmdbd until slurmdbd is back.
"""

from __future__ import annotations

import os
from pathlib import Path

from clustertrain.errors import UserError

from . import accounting, daemons, faults, readiness
from .layout import conf_path

# The name a user gives, and the daemon it stands for.
SERVICES = {"controller": "slurmctld", "accounting": "slurmdbd"}


def _daemon(state_dir: Path, service: str) -> tuple[dict, dict]:
    """The running cluster's record and the recorded process of ``service``'s daemon."""
    record = daemons.read_record(state_dir)
    if record is None:
        raise UserError("no local cluster is up: run `clustertrain cluster up` first")
    name = SERVICES[service]
    proc = next((p for p in record["processes"] if p["name"] == name), None)
    if proc is None:
        raise UserError(
            f"{service}: this cluster runs no {name} (it was started with --no-accounting)"
        )
    return record, proc


def stop(state_dir: Path, service: str) -> str:
    """Stop ``service``'s daemon by its PID; ``heal`` or ``up`` brings it back."""
    state_dir = Path(state_dir).absolute()
    record, proc = _daemon(state_dir, service)
    daemons.stop([proc])
    record["failed"] = {**record.get("failed", {}), service: "stopped"}
    daemons.write_record(state_dir, record)
    return (
        f"{service}: {proc['name']} (pid {proc['pid']}) stopped; "
        f"`clustertrain cluster heal {service}` starts it again"
    )


def start(state_dir: Path, service: str) -> str:
    """Start ``service``'s daemon again (a no-op while it runs), with the command line ``up``
    gave it, and wait until it serves."""
    state_dir = Path(state_dir).absolute()
    record, proc = _daemon(state_dir, service)
    if daemons.alive(proc):
        return f"{service}: {proc['name']} (pid {proc['pid']}) is running"
    layout = daemons.record_layout(record)
    argv = dict(daemons.commands(layout, faults.names_of(record)))[proc["name"]]
    env = {
        **os.environ,
        "SLURM_CONF": str(conf_path(state_dir)),
        daemons.CLUSTER_ID_VAR: record["id"],
        **accounting.daemon_env(state_dir),
    }
    started = daemons.spawn(proc["name"], argv, Path(proc["log"]), env)
    record["processes"] = [started if p is proc else p for p in record["processes"]]
    record["failed"] = {k: v for k, v in record.get("failed", {}).items() if k != service}
    daemons.write_record(state_dir, record)
    readiness.after_start(proc["name"], layout, started)
    return f"{service}: {proc['name']} started again (pid {started['pid']})"


def restart(state_dir: Path, service: str) -> str:
    stop(state_dir, service)
    return start(state_dir, service)


def add_user(state_dir: Path, user: str) -> str:
    """Register ``user`` with the running cluster's accounting, as a site's admin does."""
    record = daemons.read_record(Path(state_dir).absolute())
    if record is None:
        raise UserError("no local cluster is up: run `clustertrain cluster up` first")
    return accounting.add_user(daemons.record_layout(record), user)
