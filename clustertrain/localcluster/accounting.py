"""Slurm's accounting on the local cluster, as sites run it: ``slurmdbd`` on the head host, its
database in MariaDB (Debian's ``mariadb-server``), every job and step recorded for ``sacct``.

``cluster up`` (the default) makes a fresh database each time (job ids restart at 1 with a fresh
slurmctld; old jobs of the same ids would answer ``sacct -j 1`` otherwise), starts ``mariadbd``
on a Unix socket only (no TCP port), then ``slurmdbd`` on the controller's address, then
registers the cluster, an account and root (and the user who ran sudo) with ``sacctmgr``,
before slurmctld starts. ``cluster up --no-accounting`` keeps a site without slurmdbd: finished
jobs only in the job-completion log (``sacct --completion``).

slurmdbd runs as root (``SlurmUser=root``) and reaches the database as MariaDB's root through
its socket (``unix_socket`` authentication: no password is kept anywhere). MariaDB is this
host's for either Slurm: a 24.11 slurmdbd (from the root filesystem) reaches the same socket in
the state folder, which its mount namespace binds.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

from clustertrain.errors import UserError

from .layout import Layout, clients_dir, conf_path, munge_socket

PACKAGES = ["mariadb-server", "slurmdbd"]
DATABASE = "slurm_acct_db"
CLUSTER = "clustertrain"  # slurm.conf's ClusterName
ACCOUNT = "clustertrain"


def db_dir(state_dir: Path) -> Path:
    return state_dir / "db"


def db_socket(state_dir: Path) -> Path:
    return state_dir / "run" / "mariadb.sock"


def dbd_conf_path(state_dir: Path) -> Path:
    """slurmdbd.conf: slurmdbd reads it beside the slurm.conf that SLURM_CONF names."""
    return state_dir / "slurmdbd.conf"


def slurm_conf_lines(layout: Layout) -> list[tuple[str, str]]:
    """What slurm.conf says about accounting, with slurmdbd or without."""
    d = layout.state_dir
    jobcomp = [("JobCompType", "jobcomp/filetxt"), ("JobCompLoc", str(d / "spool" / "jobcomp.log"))]
    if not layout.accounting:
        # No slurmdbd: finished jobs are known from this file (sacct --completion reads it).
        return [
            ("AccountingStorageType", "accounting_storage/none"),
            ("JobAcctGatherType", "jobacct_gather/none"),
            *jobcomp,
        ]
    return [
        ("AccountingStorageType", "accounting_storage/slurmdbd"),
        ("AccountingStorageHost", layout.controller_address),
        ("AccountingStoragePort", str(layout.dbd_port)),
        # For slurmdbd, this names the munge socket that signs the messages to it.
        ("AccountingStoragePass", str(munge_socket(d))),
        # GPUs are accounted (AllocTRES, GPU-hours); without it sacct under-reports them.
        ("AccountingStorageTRES", "gres/gpu"),
        # Each step's MaxRSS and CPU time, sampled from /proc (no cgroup needed) every 5 s.
        ("JobAcctGatherType", "jobacct_gather/linux"),
        ("JobAcctGatherFrequency", "task=5"),
        *jobcomp,
    ]


def render_dbd_conf(layout: Layout, controller: str) -> str:
    d = layout.state_dir
    lines = [
        ("AuthType", "auth/munge"),
        ("AuthInfo", f"socket={munge_socket(d)}"),
        ("DbdHost", controller),
        ("DbdAddr", layout.controller_address),
        ("DbdPort", str(layout.dbd_port)),
        ("SlurmUser", "root"),
        ("LogFile", str(d / "log" / "slurmdbd.log")),
        ("PidFile", str(d / "run" / "slurmdbd.pid")),
        ("StorageType", "accounting_storage/mysql"),
        # "localhost": the client library's Unix socket, named by MYSQL_UNIX_PORT (daemon_env).
        ("StorageHost", "localhost"),
        ("StorageUser", "root"),
        ("StorageLoc", DATABASE),
    ]
    head = "# Written by `clustertrain cluster up`: the local cluster's accounting daemon.\n"
    return head + "".join(f"{key}={value}\n" for key, value in lines)


def prepare(layout: Layout, controller: str) -> None:
    """A fresh, empty database folder and slurmdbd.conf (root's alone: slurmdbd insists)."""
    d = layout.state_dir
    db = db_dir(d)
    subprocess.run(["rm", "-rf", "--one-file-system", str(db)], check=True)
    conf = dbd_conf_path(d)
    conf.unlink(missing_ok=True)
    if not layout.accounting:
        return
    conf.touch(mode=0o600)
    conf.write_text(render_dbd_conf(layout, controller))
    argv = [shutil.which("mariadb-install-db") or "mariadb-install-db", "--no-defaults"]
    argv += [f"--datadir={db}", "--user=root", "--auth-root-authentication-method=socket"]
    argv += ["--skip-test-db"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise UserError(f"accounting: mariadb-install-db failed: {last}")


def remove(state_dir: Path) -> None:
    """What :func:`prepare` and the database left: the database, its socket, slurmdbd.conf."""
    subprocess.run(["rm", "-rf", "--one-file-system", str(db_dir(state_dir))], check=True)
    db_socket(state_dir).unlink(missing_ok=True)
    dbd_conf_path(state_dir).unlink(missing_ok=True)


def daemon_env(state_dir: Path) -> dict[str, str]:
    """What slurmdbd's environment adds: the database's socket for the client library."""
    return {"MYSQL_UNIX_PORT": str(db_socket(state_dir))}


def users_to_register() -> list[str]:
    """root, and the user who ran ``sudo clustertrain cluster up``, if that is one."""
    names = ["root"]
    sudo_user = os.environ.get("SUDO_USER", "")
    try:
        if sudo_user and sudo_user != "root" and pwd.getpwnam(sudo_user):
            names.append(sudo_user)
    except KeyError:
        pass
    return names


def register(layout: Layout, users: list[str]) -> None:
    """The cluster, the account and ``users`` in slurmdbd's database (``sacctmgr -i``)."""
    for args in (
        ["add", "cluster", CLUSTER],
        ["add", "account", ACCOUNT, "Description=clustertrain", "Organization=clustertrain"],
        ["add", "user", ",".join(users), f"Account={ACCOUNT}", f"DefaultAccount={ACCOUNT}"],
    ):
        sacctmgr(layout, args)


def add_user(layout: Layout, user: str) -> str:
    """Register an ordinary user (``cluster add-user``), as a site's admin does for newcomers."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise UserError(f"user: {user!r} is no user of this machine: create it first") from None
    if not layout.accounting:
        return f"{user}: nothing to register (the cluster runs without accounting)"
    sacctmgr(layout, ["add", "user", user, f"Account={ACCOUNT}", f"DefaultAccount={ACCOUNT}"])
    return f"{user}: registered in account {ACCOUNT}"


def sacctmgr(layout: Layout, args: list[str]) -> str:
    clients = clients_dir(layout.state_dir)
    program = str(clients / "sacctmgr") if clients.is_dir() else "sacctmgr"
    env = {**os.environ, "SLURM_CONF": str(conf_path(layout.state_dir))}
    done = subprocess.run(
        [program, "-i", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    # What is there already ("... already exists.  Not adding.", "Nothing new added.") exits 1
    # too: slurmdbd started again finds its cluster registered.
    said = done.stdout + done.stderr
    if done.returncode != 0 and not ("already exists" in said or "Nothing new added" in said):
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise UserError(f"accounting: sacctmgr {' '.join(args[:2])} failed: {last}")
    return done.stdout
