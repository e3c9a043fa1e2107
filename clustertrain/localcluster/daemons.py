"""The local cluster's daemons: their command lines, and their supervision by PID and process
start time, never by name.

``up`` records every PID it starts (with the start time, so a reused PID is never signalled)
in ``state.json``; ``down`` stops exactly those, and the job steps their slurmd left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from clustertrain.procs import proc_stat, start_time

from . import accounting, login, netns, rootfs
from .layout import (
    SLURM_DEFAULT,
    Layout,
    conf_path,
    dns_conf,
    hosts_file,
    munge_socket,
    record_path,
    resolv_file,
)

CLUSTER_ID_VAR = "CLUSTERTRAIN_CLUSTER_ID"


def which(program: str) -> str | None:
    """``program``'s path, looked up in the sbin folders too (daemons live there)."""
    return shutil.which(program, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def commands(layout: Layout, names: netns.Names) -> list[tuple[str, list[str]]]:
    """(name, argv) of every daemon, in the order they start; each stays in the foreground.

    munged first: the others authenticate through it. The namespace network's name server
    (dnsmasq) binds the bridge address, so it starts after the bridge exists.
    """
    d = layout.state_dir
    munge = d / "munge"
    conf = str(conf_path(d))
    # munged -f: without it munged refuses a group-writable folder above its files
    # ("PRNG seed dir is insecure"), e.g. a state dir in a CI workspace.
    munged = [
        which("munged") or "munged",
        "-F",
        "-f",
        f"--socket={munge_socket(d)}",
        f"--key-file={munge / 'munge.key'}",
        f"--pid-file={munge / 'munged.pid'}",
        f"--seed-file={munge / 'seed'}",
        f"--log-file={d / 'log' / 'munged.log'}",
    ]
    found = [("munged", munged)]
    if layout.accounting:  # the database, then slurmdbd: slurmctld registers with it
        found.append(("mariadb", _mariadb(d)))
        found.append(("slurmdbd", _slurm_daemon(layout, ["slurmdbd", "-D"])))
    found.append(("slurmctld", _slurm_daemon(layout, ["slurmctld", "-D", "-f", conf])))
    if layout.network == "namespaces":
        dnsmasq = [
            which("dnsmasq") or "dnsmasq",
            "--keep-in-foreground",
            f"--conf-file={dns_conf(d)}",
        ]
        found.append(("dnsmasq", dnsmasq))
    for node in layout.node_names:
        argv = _slurm_daemon(layout, ["slurmd", "-D", "-N", node, "-f", conf])
        if layout.network == "namespaces":
            argv = netns.enter(names, node, hosts_file(d, node), resolv_file(d), argv)
        found.append((f"slurmd-{node}", argv))
    if layout.network == "namespaces":
        # The login node: Debian's OpenSSH server, in the foreground (-D), logging to stderr.
        sshd = [which("sshd") or "/usr/sbin/sshd", "-D", "-e", "-f", str(login.sshd_config(d))]
        argv = netns.enter(names, login.NAME, hosts_file(d, login.NAME), resolv_file(d), sshd)
        found.append((f"sshd-{login.NAME}", argv))
    return found


def _mariadb(state_dir: Path) -> list[str]:
    """MariaDB's server for slurmdbd, in the foreground, on a Unix socket only (no TCP port),
    small: a handful of jobs (clustertrain.localcluster.accounting)."""
    return [
        which("mariadbd") or "mariadbd",
        "--no-defaults",
        f"--datadir={accounting.db_dir(state_dir)}",
        f"--socket={accounting.db_socket(state_dir)}",
        "--skip-networking",
        f"--pid-file={state_dir / 'run' / 'mariadb.pid'}",
        "--user=root",
        f"--log-error={state_dir / 'log' / 'mariadb.log'}",
        "--skip-log-bin",
        "--innodb-buffer-pool-size=64M",
        # slurmdbd's own advice (its log says so otherwise): long lock waits while it rolls up.
        "--innodb-lock-wait-timeout=900",
    ]


def _slurm_daemon(layout: Layout, argv: list[str]) -> list[str]:
    """A Slurm daemon's command line: this host's, or the root filesystem's of the layout's
    Slurm (clustertrain.localcluster.rootfs), in a mount namespace of its own."""
    if layout.slurm == SLURM_DEFAULT:
        return [which(argv[0]) or argv[0], *argv[1:]]
    base = rootfs.root(layout.slurm)
    inside = rootfs.daemon_argv(base, [layout.state_dir], [f"/usr/sbin/{argv[0]}", *argv[1:]])
    return ["unshare", "--mount", "--propagation", "slave", *inside]


def alive(proc: dict) -> bool:
    fields = proc_stat(proc["pid"])
    return fields is not None and fields[19] == proc["start_time"] and fields[0] != "Z"


def strays(cluster_id: str) -> list[int]:
    """Live processes left by this cluster's daemons: job steps and the tasks they run.

    slurmd leaves its slurmstepd processes running by design (so that a restarted slurmd takes
    them over); each stepd calls setsid and keeps its tasks in its session. The stepds inherit
    slurmd's environment, which carries our cluster id; the tasks are found by session.
    """
    marker = f"{CLUSTER_ID_VAR}={cluster_id}".encode()
    stat_of = {
        int(p.name): f
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and (f := proc_stat(int(p.name))) and f[0] != "Z"
    }
    sessions = set()
    for pid, fields in stat_of.items():
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                sessions.add(int(fields[3]))
        except OSError:
            continue
    return [pid for pid, fields in stat_of.items() if int(fields[3]) in sessions]


def by_pid(pid: int) -> dict:
    """A running process as :func:`stop` takes it: its PID with its start time, so that a PID
    the kernel has given to another process meanwhile is never signalled."""
    return {"pid": pid, "start_time": start_time(pid)}


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()[:32] or "?"
    except OSError:
        return "gone"


def spawn(name: str, argv: list[str], log: Path, env: dict[str, str]) -> dict:
    """Start a daemon in the foreground mode; its stdout and stderr go to ``log`` + .out."""
    # A double fork through sh: the daemon outlives this Python process without being its
    # child, sits in a session of its own (no terminal's Ctrl-C reaches it), and we still
    # learn its exact PID.
    sh = subprocess.run(
        ["sh", "-c", '"$@" </dev/null >>"$LOG" 2>&1 & echo $!', "sh", *argv],
        env={**env, "LOG": f"{log}.out"},
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,
    )
    pid = int(sh.stdout)
    fields = proc_stat(pid)
    return {"name": name, "pid": pid, "start_time": fields[19] if fields else "", "log": str(log)}


def stop(procs: list[dict], grace_s: float = 5.0) -> None:
    """SIGTERM the live ones, wait up to ``grace_s``, then SIGKILL what is left."""
    live = [p for p in procs if alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc["pid"], sig)
        deadline = time.monotonic() + grace_s
        while live and time.monotonic() < deadline:
            time.sleep(0.1)
            live = [p for p in live if alive(p)]
        if not live:
            return


def read_record(state_dir: Path) -> dict | None:
    try:
        return json.loads(record_path(state_dir).read_text())
    except (OSError, ValueError):
        return None


def write_record(state_dir: Path, record: dict) -> None:
    tmp = record_path(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(record_path(state_dir))


def record_layout(record: dict) -> Layout:
    return Layout(**{**record["layout"], "state_dir": Path(record["layout"]["state_dir"])})


def healthy(record: dict) -> bool:
    """Every daemon runs and no node was failed on purpose (``cluster fail``)."""
    procs = record["processes"]
    complete = [p["name"] for p in procs] == record.get("daemons")
    return complete and not record.get("failed") and all(alive(p) for p in procs)


def tail(log: str | Path, lines: int = 3) -> str:
    """The last lines of a daemon's log, or of its stdout and stderr when the log is empty."""
    for path in (Path(log), Path(f"{log}.out")):
        with contextlib.suppress(OSError):
            if text := path.read_text(errors="replace").strip().splitlines()[-lines:]:
                return f"{path}: " + " | ".join(text)
    return f"{log}: (empty)"
