"""A real multi-node Slurm cluster on this one machine, for trying and testing clustertrain.

Every node is a ``slurmd -N nodeK`` on 127.0.0.1 with its own port; one ``slurmctld`` and a
private ``munged`` (own key, socket and pid file in the state dir) serve them; no systemd.
The config is rendered from ``templates/slurm.conf.j2`` and ``templates/gres.conf.j2``: the
values are data here, the templates hold layout only. ``up`` records every PID it starts (and
the process start time, so a reused PID is never signalled) in ``state.json``; ``down`` stops
exactly those. Facts this builds on: ``shared/notes/slurm-on-one-host.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clustertrain.errors import FieldError, UserError
from clustertrain.templates import render_template

HOSTS_FILE = Path("/etc/hosts")
HOSTS_BEGIN = "# BEGIN clustertrain local cluster"
HOSTS_END = "# END clustertrain local cluster"
UP_TIMEOUT_S = 60.0
CLUSTER_ID_VAR = "CLUSTERTRAIN_CLUSTER_ID"
Line = list[tuple[str, str]]


def default_state_dir() -> Path:
    return Path(os.environ.get("CLUSTERTRAIN_CLUSTER_DIR", "/var/lib/clustertrain/cluster"))


@dataclass(frozen=True)
class Layout:
    """The cluster's shape. slurmctld listens on ``base_port``, node K's slurmd on base_port+K."""

    nodes: int = 4
    cpus_per_node: int = 8
    gpus_per_node: int = 2
    memory_mb_per_node: int = 4096
    base_port: int = 16817
    state_dir: Path = field(default_factory=default_state_dir)

    def __post_init__(self) -> None:
        for name, low, high in [
            ("nodes", 1, 64),
            ("cpus_per_node", 1, 1024),
            ("gpus_per_node", 0, 64),
            ("memory_mb_per_node", 1, 1 << 24),
            ("base_port", 1024, 65535 - self.nodes),
        ]:
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= high:
                raise FieldError(name, value, f"use a whole number from {low} to {high}")
        object.__setattr__(self, "state_dir", Path(self.state_dir).absolute())

    @property
    def node_names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.nodes + 1)]

    @property
    def ports(self) -> list[int]:
        return [self.base_port + k for k in range(self.nodes + 1)]


def _conf(state_dir: Path) -> Path:
    return state_dir / "slurm.conf"


def _record_path(state_dir: Path) -> Path:
    return state_dir / "state.json"


def _munge_socket(state_dir: Path) -> Path:
    return state_dir / "munge" / "munged.socket"


def _gpu_files(layout: Layout, node: str) -> list[Path]:
    return [layout.state_dir / "gpu" / node / f"gpu{i}" for i in range(layout.gpus_per_node)]


def render_slurm_conf(layout: Layout, controller: str) -> str:
    """slurm.conf for ``layout``; ``controller`` is this host's short name (``hostname -s``)."""
    d = layout.state_dir
    settings = [
        ("ClusterName", "clustertrain"),
        ("SlurmctldHost", f"{controller}(127.0.0.1)"),
        ("SlurmctldPort", str(layout.base_port)),
        ("AuthType", "auth/munge"),
        ("AuthInfo", f"socket={_munge_socket(d)}"),
        ("CredType", "cred/munge"),
        ("SlurmUser", "root"),
        ("SlurmdUser", "root"),
        ("StateSaveLocation", str(d / "spool" / "slurmctld")),
        ("SlurmdSpoolDir", str(d / "spool" / "%n")),
        ("SlurmctldPidFile", str(d / "run" / "slurmctld.pid")),
        ("SlurmdPidFile", str(d / "run" / "slurmd-%n.pid")),
        ("SlurmctldLogFile", str(d / "log" / "slurmctld.log")),
        ("SlurmdLogFile", str(d / "log" / "slurmd-%n.log")),
        # No cgroups and no systemd here (notes: slurm-on-one-host.md).
        ("ProctrackType", "proctrack/linuxproc"),
        ("TaskPlugin", "task/none"),
        ("MpiDefault", "none"),
        ("SwitchType", "switch/none"),
        ("SelectType", "select/cons_tres"),
        ("SelectTypeParameters", "CR_Core"),
        ("GresTypes", "gpu"),
        # Nodes declare more CPUs than the host has; without this they go INVALID ("Low CPUs").
        ("SlurmdParameters", "config_overrides"),
        # Batch jobs start in 1-3 s instead of ~10 s.
        ("SchedulerParameters", "batch_sched_delay=0"),
        # No slurmdbd: finished jobs are known from this file (sacct --completion reads it).
        ("AccountingStorageType", "accounting_storage/none"),
        ("JobAcctGatherType", "jobacct_gather/none"),
        ("JobCompType", "jobcomp/filetxt"),
        ("JobCompLoc", str(d / "spool" / "jobcomp.log")),
        ("JobRequeue", "1"),
        ("ReturnToService", "2"),
        ("SlurmctldTimeout", "30"),
        ("SlurmdTimeout", "60"),
        ("InactiveLimit", "0"),
        # scontrol show job still knows a job for an hour after it ends.
        ("MinJobAge", "3600"),
        # Seconds between SIGTERM and SIGKILL on scancel or time limit: keeps cancel quick.
        ("KillWait", "2"),
        ("MessageTimeout", "5"),
    ]
    nodes = [
        [
            ("NodeName", name),
            ("NodeAddr", "127.0.0.1"),
            ("NodeHostname", name),
            ("Port", str(port)),
            ("CPUs", str(layout.cpus_per_node)),
            ("RealMemory", str(layout.memory_mb_per_node)),
        ]
        + ([("Gres", f"gpu:{layout.gpus_per_node}")] if layout.gpus_per_node else [])
        + [("State", "UNKNOWN")]
        for name, port in zip(layout.node_names, layout.ports[1:], strict=True)
    ]
    partitions = [
        [
            ("PartitionName", "debug"),
            ("Nodes", ",".join(layout.node_names)),
            ("Default", "YES"),
            ("MaxTime", "INFINITE"),
            ("State", "UP"),
        ]
    ]
    return render_template(
        "slurm.conf.j2",
        conf_path=str(_conf(d)),
        settings=settings,
        nodes=nodes,
        partitions=partitions,
    )


def render_gres_conf(layout: Layout) -> str:
    """gres.conf: each GPU is a device file; without ``File=`` Slurm drops the GPUs."""
    gres: list[Line] = [
        [("NodeName", node), ("Name", "gpu"), ("File", str(path))]
        for node in layout.node_names
        for path in _gpu_files(layout, node)
    ]
    return render_template("gres.conf.j2", gres=gres)


def hosts_without_block(text: str) -> str:
    lines = text.splitlines(keepends=True)
    if HOSTS_BEGIN + "\n" not in lines:
        return text
    start = lines.index(HOSTS_BEGIN + "\n")
    end = lines.index(HOSTS_END + "\n", start) if HOSTS_END + "\n" in lines[start:] else start
    return "".join(lines[:start] + lines[end + 1 :])


def hosts_with_block(text: str, names: list[str]) -> str:
    text = hosts_without_block(text)
    if text and not text.endswith("\n"):
        text += "\n"
    return text + f"{HOSTS_BEGIN}\n127.0.0.1 {' '.join(names)}\n{HOSTS_END}\n"


# --- processes, by PID and start time ------------------------------------------------------


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat from the state on (the name may hold spaces and parentheses)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    fields = _proc_stat(pid)
    return fields[19] if fields else None


def _alive(proc: dict) -> bool:
    fields = _proc_stat(proc["pid"])
    return fields is not None and fields[19] == proc["start_time"] and fields[0] != "Z"


def _strays(cluster_id: str) -> list[int]:
    """Live processes left by this cluster's daemons: job steps and the tasks they run.

    slurmd leaves its slurmstepd processes running by design (so that a restarted slurmd takes
    them over); each stepd calls setsid and keeps its tasks in its session. The stepds inherit
    slurmd's environment, which carries our cluster id; the tasks are found by session.
    """
    marker = f"{CLUSTER_ID_VAR}={cluster_id}".encode()
    stat_of = {
        int(p.name): f
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and (f := _proc_stat(int(p.name))) and f[0] != "Z"
    }
    sessions = set()
    for pid, fields in stat_of.items():
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                sessions.add(int(fields[3]))
        except OSError:
            continue
    return [pid for pid, fields in stat_of.items() if int(fields[3]) in sessions]


def _spawn(name: str, argv: list[str], log: Path, env: dict[str, str]) -> dict:
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
    fields = _proc_stat(pid)
    return {"name": name, "pid": pid, "start_time": fields[19] if fields else "", "log": str(log)}


def _stop(procs: list[dict], grace_s: float = 5.0) -> None:
    """SIGTERM the live ones, wait up to ``grace_s``, then SIGKILL what is left."""
    live = [p for p in procs if _alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc["pid"], sig)
        deadline = time.monotonic() + grace_s
        while live and time.monotonic() < deadline:
            time.sleep(0.1)
            live = [p for p in live if _alive(p)]
        if not live:
            return


# --- state record -------------------------------------------------------------------------


def _read_record(state_dir: Path) -> dict | None:
    try:
        return json.loads(_record_path(state_dir).read_text())
    except (OSError, ValueError):
        return None


def _write_record(state_dir: Path, record: dict) -> None:
    tmp = _record_path(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(_record_path(state_dir))


def _record_layout(record: dict) -> Layout:
    return Layout(**{**record["layout"], "state_dir": Path(record["layout"]["state_dir"])})


def _healthy(record: dict) -> bool:
    procs = record["processes"]
    return len(procs) == record["layout"]["nodes"] + 2 and all(_alive(p) for p in procs)


def current_layout(state_dir: Path) -> Layout | None:
    """The layout of the cluster recorded in ``state_dir`` if its slurmctld runs, else None."""
    record = _read_record(state_dir)
    if record and any(p["name"] == "slurmctld" and _alive(p) for p in record["processes"]):
        return _record_layout(record)
    return None


def local_slurm_conf() -> Path | None:
    """The slurm.conf of the local cluster if one is up (for when SLURM_CONF is unset)."""
    layout = current_layout(default_state_dir())
    return _conf(layout.state_dir) if layout else None


# --- up / down / status -------------------------------------------------------------------


def _slurm(args: list[str], state_dir: Path, timeout: float = 10) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_CONF": str(_conf(state_dir))}
    try:
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 124, "", "")


def _which(program: str) -> str | None:
    return shutil.which(program, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def _ensure_packages() -> None:
    if all(_which(p) for p in ("munged", "slurmctld", "slurmd", "sinfo")):
        return
    if not _which("apt-get"):
        raise UserError(
            "Slurm or munge is missing and this is not Debian/Ubuntu (no apt-get): "
            "install slurm-wlm and munge with your package manager, then run up again"
        )
    # Package scripts would start the system's own daemons; policy-rc.d exit 101 forbids that.
    policy = Path("/usr/sbin/policy-rc.d")
    created = not policy.exists()
    if created:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "slurm-wlm", "munge"]
    try:
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True)
            done = subprocess.run(install, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise UserError(f"apt-get install slurm-wlm munge failed: {last}")
    finally:
        if created:
            policy.unlink()


def _check_ports(layout: Layout) -> None:
    for port in layout.ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                raise UserError(
                    f"port {port} is in use; the local cluster needs ports {layout.ports[0]}-"
                    f"{layout.ports[-1]}: free them or choose another base port"
                ) from None


def _tail(log: str | Path, lines: int = 3) -> str:
    """The last lines of a daemon's log, or of its stdout and stderr when the log is empty."""
    for path in (Path(log), Path(f"{log}.out")):
        with contextlib.suppress(OSError):
            if text := path.read_text(errors="replace").strip().splitlines()[-lines:]:
                return f"{path}: " + " | ".join(text)
    return f"{log}: (empty)"


def _prepare(layout: Layout, controller: str) -> None:
    d = layout.state_dir
    for sub in ("spool", "run", "log", "gpu"):
        shutil.rmtree(d / sub, ignore_errors=True)
    for sub in ["run", "log", "spool/slurmctld", *(f"spool/{n}" for n in layout.node_names)]:
        (d / sub).mkdir(parents=True, exist_ok=True)
    # munged refuses a key or socket folder that others may write; Slurm clients must reach
    # the socket, so the folder is world-executable.
    (d / "munge").mkdir(mode=0o755, exist_ok=True)
    d.chmod(0o755)
    (d / "munge").chmod(0o755)
    key = d / "munge" / "munge.key"
    if not key.exists():
        key.touch(mode=0o600)
        key.write_bytes(os.urandom(1024))
    _munge_socket(d).unlink(missing_ok=True)
    for node in layout.node_names:
        for gpu in _gpu_files(layout, node):
            gpu.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(gpu, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # like /dev/null
            gpu.chmod(0o666)  # mknod's mode is cut by the umask
    _conf(d).write_text(render_slurm_conf(layout, controller))
    (d / "gres.conf").write_text(render_gres_conf(layout))


def _wait_until_idle(layout: Layout, record: dict) -> None:
    deadline = time.monotonic() + UP_TIMEOUT_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        dead = [p for p in record["processes"] if not _alive(p)]
        if dead:
            raise UserError(f"{dead[0]['name']} exited during start-up; {_tail(dead[0]['log'])}")
        out = _slurm(["sinfo", "-h", "-N", "-o", "%N %T"], layout.state_dir)
        states = dict(line.split() for line in out.stdout.splitlines() if out.returncode == 0)
        if states and all(states.get(n) == "idle" for n in layout.node_names):
            return
        time.sleep(0.2)
    if not states:
        raise UserError(
            f"slurmctld did not answer within {UP_TIMEOUT_S:.0f} s; "
            f"{_tail(layout.state_dir / 'log' / 'slurmctld.log')}"
        )
    node = next(n for n in layout.node_names if states.get(n) != "idle")
    log = layout.state_dir / "log" / f"slurmd-{node}.log"
    raise UserError(
        f"{node} is {states.get(node, 'missing')}, not idle, after "
        f"{UP_TIMEOUT_S:.0f} s; {_tail(log)}"
    )


def _shape(layout: Layout) -> str:
    return (
        f"{layout.nodes} nodes x {layout.cpus_per_node} CPUs, {layout.gpus_per_node} GPUs, "
        f"{layout.memory_mb_per_node} MB"
    )


def up(layout: Layout) -> str:
    """Start the cluster (a no-op when this layout is already up); returns the SLURM_CONF path."""
    if os.geteuid() != 0:
        raise UserError("the local cluster must be started as root: run it with sudo")
    running = current_layout(layout.state_dir)
    if running and running != layout:
        raise UserError(
            f"a local cluster of another shape ({_shape(running)}) is up in "
            f"{layout.state_dir}: run `clustertrain cluster down` first"
        )
    old = _read_record(layout.state_dir)
    if running and old and _healthy(old):
        return str(_conf(layout.state_dir))
    down(layout.state_dir)  # whatever a crashed or half-dead cluster left
    _ensure_packages()
    _check_ports(layout)
    d = layout.state_dir
    d.mkdir(parents=True, exist_ok=True)
    _prepare(layout, socket.gethostname().split(".")[0])
    record: dict = {
        "id": secrets.token_hex(8),
        "layout": {**asdict(layout), "state_dir": str(d)},
        "processes": [],
        "hosts_block": True,
    }
    # Recorded before each change, so that down can undo a start-up cut short at any point.
    _write_record(d, record)
    HOSTS_FILE.write_text(hosts_with_block(HOSTS_FILE.read_text(), layout.node_names))
    env = {**os.environ, "SLURM_CONF": str(_conf(d)), CLUSTER_ID_VAR: record["id"]}
    munge = d / "munge"
    # munged -f: without it munged refuses a group-writable folder above its files
    # ("PRNG seed dir is insecure"), e.g. a state dir in a CI workspace.
    daemons = [
        (
            "munged",
            [
                _which("munged") or "munged",
                "-F",
                "-f",
                f"--socket={_munge_socket(d)}",
                f"--key-file={munge / 'munge.key'}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'seed'}",
                f"--log-file={d / 'log' / 'munged.log'}",
            ],
        ),
        ("slurmctld", [_which("slurmctld") or "slurmctld", "-D", "-f", str(_conf(d))]),
    ]
    daemons += [
        (f"slurmd-{n}", [_which("slurmd") or "slurmd", "-D", "-N", n, "-f", str(_conf(d))])
        for n in layout.node_names
    ]
    try:
        for name, argv in daemons:
            record["processes"].append(_spawn(name, argv, d / "log" / f"{name}.log", env))
            _write_record(d, record)
            if name == "munged":
                _wait_for_munge(d, record["processes"][0])
        _wait_until_idle(layout, record)
    except BaseException:
        down(d)
        raise
    return str(_conf(d))


def _wait_for_munge(state_dir: Path, proc: dict) -> None:
    deadline = time.monotonic() + 10
    while not _munge_socket(state_dir).exists():
        if not _alive(proc) or time.monotonic() > deadline:
            raise UserError(f"munged did not start; {_tail(state_dir / 'log' / 'munged.log')}")
        time.sleep(0.05)


def _cancel_jobs(state_dir: Path) -> None:
    """Cancel every job while slurmd still runs, so their steps end the ordinary way."""
    jobs = _slurm(["squeue", "-h", "-o", "%A"], state_dir).stdout.split()
    if not jobs:
        return
    _slurm(["scancel", *jobs], state_dir)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _slurm(["squeue", "-h", "-t", "R,CG"], state_dir).stdout:
        time.sleep(0.2)


def down(state_dir: Path) -> None:
    """Stop what ``up`` started in ``state_dir`` and undo its /etc/hosts change; safe to repeat."""
    state_dir = Path(state_dir).absolute()
    record = _read_record(state_dir)
    if record is None:
        return
    procs = record["processes"]
    if any(p["name"] == "slurmctld" and _alive(p) for p in procs):
        _cancel_jobs(state_dir)
    # munged goes last: the Slurm daemons authenticate their goodbye messages through it.
    _stop([p for p in procs if p["name"] != "munged"])
    started = {p["pid"] for p in procs}
    _stop(
        [
            {"pid": pid, "start_time": _start_time(pid)}
            for pid in _strays(record["id"])
            if pid not in started
        ],
        grace_s=2.0,
    )
    _stop(procs)
    if record.get("hosts_block"):
        HOSTS_FILE.write_text(hosts_without_block(HOSTS_FILE.read_text()))
    for path in (state_dir / "run").glob("*.pid"):
        path.unlink()
    _munge_socket(state_dir).unlink(missing_ok=True)
    _record_path(state_dir).unlink()


def status(state_dir: Path) -> str:
    """Human-readable lines: is the cluster up, each daemon by PID, each node's Slurm state."""
    state_dir = Path(state_dir).absolute()
    record = _read_record(state_dir)
    if record is None:
        return f"local cluster: down (nothing recorded in {state_dir})"
    layout = _record_layout(record)
    alive = {p["name"]: _alive(p) for p in record["processes"]}
    if alive.get("slurmctld"):
        out = _slurm(["sinfo", "-h", "-N", "-o", "%N %T"], state_dir)
        nodes = dict(line.split() for line in out.stdout.splitlines())
    else:
        nodes = {}
    head = (
        f"local cluster: {'up' if _healthy(record) else 'degraded (run down, then up)'}, "
        f"{_shape(layout)}; export SLURM_CONF={_conf(state_dir)}"
    )
    lines = [head]
    for p in record["processes"]:
        node = p["name"].removeprefix("slurmd-") if p["name"].startswith("slurmd-") else ""
        state = "running" if alive[p["name"]] else "not running"
        extra = f"  {node} {nodes.get(node, 'unknown')}" if node else ""
        lines.append(f"  {p['name']:<14} pid {p['pid']:<8} {state}{extra}")
    return "\n".join(lines)
