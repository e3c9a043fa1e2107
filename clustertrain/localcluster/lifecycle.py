"""``up``, ``down`` and ``status`` of the local cluster: packages, files, daemons, readiness."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import stat
import time
from dataclasses import asdict
from pathlib import Path

from clustertrain.backends.remote import ssh
from clustertrain.errors import UserError

from . import accounting, apt, daemons, faults, login, modules, netns, readiness, rootfs
from .layout import (
    SLURM_DEFAULT,
    Layout,
    clients_dir,
    conf_path,
    default_state_dir,
    dns_conf,
    gpu_files,
    hosts_file,
    munge_socket,
    record_path,
    resolv_file,
)
from .slurm_conf import (
    hosts_lines,
    hosts_with_block,
    hosts_without_block,
    render_dns_conf,
    render_gres_conf,
    render_node_hosts,
    render_node_resolv,
    render_oci_conf,
    render_slurm_conf,
)

HOSTS_FILE = Path("/etc/hosts")
RUN_SSHD = Path("/run/sshd")
# Each node's resolv.conf is bound over this file in its mount namespace; it must exist.
RESOLV_FILE = Path("/etc/resolv.conf")


def current_layout(state_dir: Path) -> Layout | None:
    """The layout of the cluster recorded in ``state_dir`` if its slurmctld runs, else None."""
    record = daemons.read_record(state_dir)
    if record and any(p["name"] == "slurmctld" and daemons.alive(p) for p in record["processes"]):
        return daemons.record_layout(record)
    return None


def local_slurm_conf() -> Path | None:
    """The slurm.conf of the local cluster if its slurmctld runs, else None."""
    layout = current_layout(default_state_dir())
    return conf_path(layout.state_dir) if layout else None


def _ensure_packages() -> None:
    programs = ("munged", "slurmctld", "slurmd", "sinfo", "runc", "dnsmasq", "sshd", "slurmdbd")
    if all(daemons.which(p) for p in [*programs, "mariadbd"]) and modules.installed():
        return
    if not daemons.which("apt-get"):
        raise UserError(
            "Slurm or munge is missing and this is not Debian/Ubuntu (no apt-get): "
            "install slurm-wlm and munge with your package manager, then run up again"
        )
    # runc: srun --container (oci.conf) runs a job's step in an OCI bundle with it.
    # dnsmasq-base: the namespace network's name server, without the package that would make
    # it the system's (its service and /etc/dnsmasq.conf).
    # openssh-server: the login node's sshd (its service stays off: apt.install's policy-rc.d).
    # mariadb-server, slurmdbd: accounting (accounting.py); lmod: environment modules, as
    # sites load CUDA and NCCL (modules.py). Installed whether or not this cluster uses them.
    apt.install(["slurm-wlm", "munge", "runc", "dnsmasq-base", "openssh-server"]
                + accounting.PACKAGES + modules.PACKAGES)  # fmt: skip


def _check_machine(layout: Layout) -> None:
    """What this machine must offer the layout: its CPUs, and namespaces with a free subnet."""
    cpus = len(os.sched_getaffinity(0))
    if layout.cpus_per_node > cpus:
        raise UserError(
            f"cpus_per_node: {layout.cpus_per_node} is more than the {cpus} CPUs this machine "
            f"has; Slurm binds each step to real CPUs: use --cpus-per-node {cpus} or fewer"
        )
    if layout.network == "namespaces":
        missing = [p for p in ("ip", "nsenter", "unshare", "mount") if not daemons.which(p)]
        if missing:
            raise UserError(
                f"layout: namespaces need {', '.join(missing)} (iproute2, util-linux): install "
                "them, or use `clustertrain cluster up --layout loopback`"
            )
        if not RESOLV_FILE.exists():
            raise UserError(
                f"layout: namespaces bind each node's resolver over {RESOLV_FILE}, which this "
                "machine lacks: create it (empty will do), or use `--layout loopback`"
            )
        netns.check_subnet_free(layout)
    _check_ports(layout)


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
    munge_socket(d).unlink(missing_ok=True)
    for node in layout.node_names:
        for gpu in gpu_files(layout, node):
            gpu.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(gpu, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # like /dev/null
            gpu.chmod(0o666)  # mknod's mode is cut by the umask
    conf_path(d).write_text(render_slurm_conf(layout, controller))
    shutil.rmtree(clients_dir(d), ignore_errors=True)
    (d / "cgroup.conf").unlink(missing_ok=True)
    if layout.slurm != SLURM_DEFAULT:
        base = rootfs.ensure(layout.slurm, [d])
        rootfs.write_clients(base, clients_dir(d))
        (d / "cgroup.conf").write_text(rootfs.cgroup_conf(layout.slurm) or "")
    (d / "gres.conf").write_text(render_gres_conf(layout))
    (d / "oci.conf").write_text(render_oci_conf(layout))
    accounting.prepare(layout, controller)
    if layout.network == "namespaces":
        (d / "hosts").mkdir(exist_ok=True)
        for host in layout.host_addresses:
            hosts_file(d, host).write_text(render_node_hosts(layout, controller))
        login.prepare(layout)
        resolv_file(d).write_text(render_node_resolv(layout))
        dns_conf(d).write_text(render_dns_conf(layout, controller))


def up(layout: Layout) -> str:
    """Start the cluster (a no-op when this layout is already up); returns the SLURM_CONF path."""
    if os.geteuid() != 0:
        raise UserError("the local cluster must be started as root: run it with sudo")
    running = current_layout(layout.state_dir)
    if running and running != layout:
        raise UserError(
            f"a local cluster of another shape ({running.describe()}) is up in "
            f"{layout.state_dir}: run `clustertrain cluster down` first"
        )
    old = daemons.read_record(layout.state_dir)
    if running and old and daemons.healthy(old):
        return str(conf_path(layout.state_dir))
    down(layout.state_dir)  # whatever a crashed or half-dead cluster left
    _ensure_packages()
    _check_machine(layout)
    d = layout.state_dir
    d.mkdir(parents=True, exist_ok=True)
    controller = socket.gethostname().split(".")[0]
    _prepare(layout, controller)
    record: dict = {
        "id": secrets.token_hex(8),
        "layout": {**asdict(layout), "state_dir": str(d)},
        "processes": [],
        # Loopback nodes share this host's /etc/hosts; namespace nodes each have their own.
        "hosts_block": layout.network == "loopback",
        # sshd's privilege separation folder, made here where no sshd ever ran (up removes
        # only what it made).
        "run_sshd": layout.network == "namespaces" and not RUN_SSHD.exists(),
    }
    names = _names(record)
    to_start = daemons.commands(layout, names)
    record["daemons"] = [name for name, _ in to_start]
    # Recorded before each change, so that down can undo a start-up cut short at any point.
    daemons.write_record(d, record)
    if record["hosts_block"]:
        HOSTS_FILE.write_text(hosts_with_block(HOSTS_FILE.read_text(), hosts_lines(layout)))
    if record["run_sshd"]:
        RUN_SSHD.mkdir(mode=0o755)
    env = {**os.environ, "SLURM_CONF": str(conf_path(d)), daemons.CLUSTER_ID_VAR: record["id"]}
    env.update(accounting.daemon_env(d))
    try:
        if layout.network == "namespaces":
            netns.create(layout, names)
        for name, argv in to_start:
            record["processes"].append(daemons.spawn(name, argv, d / "log" / f"{name}.log", env))
            daemons.write_record(d, record)
            readiness.after_start(name, layout, record["processes"][-1])
        readiness.wait_until_idle(layout, record)
        if layout.network == "namespaces":
            sshd = record["processes"][-1]
            login.wait_listening(layout, lambda: daemons.alive(sshd))
            record["ssh_config_made"] = login.include(d)
            daemons.write_record(d, record)
    except BaseException:
        down(d)
        raise
    return str(conf_path(d))


def _names(record: dict) -> netns.Names:
    return faults.names_of(record)


def _cancel_jobs(state_dir: Path) -> None:
    """Cancel every job while slurmd still runs, so their steps end the ordinary way."""
    slurm = readiness.slurm(state_dir)
    jobs = slurm.job_ids()
    if not jobs:
        return
    slurm.cancel_all(jobs)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and slurm.job_ids("R,CG"):
        time.sleep(0.2)


def down(state_dir: Path) -> None:
    """Stop what ``up`` started in ``state_dir`` and undo its /etc/hosts change; safe to repeat."""
    state_dir = Path(state_dir).absolute()
    record = daemons.read_record(state_dir)
    if record is None:
        return
    procs = record["processes"]
    if any(p["name"] == "slurmctld" and daemons.alive(p) for p in procs):
        _cancel_jobs(state_dir)
    # munged goes last: the Slurm daemons authenticate their goodbye messages through it.
    daemons.stop([p for p in procs if p["name"] != "munged"])
    started = {p["pid"] for p in procs}
    daemons.stop(
        [daemons.by_pid(pid) for pid in daemons.strays(record["id"]) if pid not in started],
        grace_s=2.0,
    )
    daemons.stop(procs)
    if record.get("hosts_block"):
        HOSTS_FILE.write_text(hosts_without_block(HOSTS_FILE.read_text()))
    if daemons.record_layout(record).network == "namespaces":
        faults.heal_names(_names(record), daemons.record_layout(record).node_names)
        _end_hosts(_names(record))
        login.exclude(state_dir, bool(record.get("ssh_config_made")))
        netns.remove(_names(record))
    if record.get("run_sshd"):
        shutil.rmtree(RUN_SSHD, ignore_errors=True)
    for path in (state_dir / "run").glob("*.pid"):
        path.unlink()
    munge_socket(state_dir).unlink(missing_ok=True)
    # clustertrain.backends.slurm falls back to this file while it exists: only while the
    # cluster is up.
    conf_path(state_dir).unlink(missing_ok=True)
    (state_dir / "oci.conf").unlink(missing_ok=True)
    (state_dir / "cgroup.conf").unlink(missing_ok=True)
    accounting.remove(state_dir)
    shutil.rmtree(clients_dir(state_dir), ignore_errors=True)
    dns_conf(state_dir).unlink(missing_ok=True)
    resolv_file(state_dir).unlink(missing_ok=True)
    record_path(state_dir).unlink()


def _end_hosts(names: netns.Names) -> None:
    """End every process still in a host's namespace (the login node's ssh sessions and what
    they started, a node's leftovers), by PID: first this side's master connection to the login
    node, so that its session ends the ordinary way. A process that outlives SIGKILL keeps the
    namespaces: this raises, naming it, and `down` can be run again once it is gone."""
    ssh.stop_master(login.NAME)
    left = netns.processes(names)
    daemons.stop([daemons.by_pid(pid) for pids in left.values() for pid in pids], grace_s=2.0)
    stuck = _describe(netns.processes(names))
    if stuck:
        raise UserError(
            f"processes are left on the local cluster's hosts: {stuck}; end them "
            "(kill -9 PID), then run `clustertrain cluster down` again"
        )


# How many processes of one host `status` names (a job's ranks can be many).
_MAX_NAMED = 8


def _describe(found: dict[str, list[int]]) -> str:
    return "; ".join(
        f"{host}: " + ", ".join(f"pid {pid} ({daemons.command_name(pid)})" for pid in pids)
        for host, pids in found.items()
    )


def status(state_dir: Path) -> str:
    """Human-readable lines: is the cluster up, each daemon by PID, each node's Slurm state."""
    state_dir = Path(state_dir).absolute()
    record = daemons.read_record(state_dir)
    if record is None:
        return f"local cluster: down (nothing recorded in {state_dir})"
    layout = daemons.record_layout(record)
    alive = {p["name"]: daemons.alive(p) for p in record["processes"]}
    nodes = readiness.slurm(state_dir).node_states() if alive.get("slurmctld") else {}
    health = "up" if daemons.healthy(record) else "degraded (`cluster up` restarts it)"
    head = f"local cluster: {health}, {layout.describe()}; export SLURM_CONF={conf_path(state_dir)}"
    where = (
        f"a host of its own (network, UTS and mount namespaces) on bridge "
        f"{_names(record).bridge} ({layout.subnet}); controller {layout.controller_address}"
        if layout.network == "namespaces"
        else "on 127.0.0.1 with its own port"
    )
    lines = [head, f"  layout: {layout.network}: every node {where}"]
    addresses = layout.node_addresses
    for p in record["processes"]:
        node = p["name"].removeprefix("slurmd-") if p["name"].startswith("slurmd-") else ""
        state = "running" if alive[p["name"]] else "not running"
        failed = record.get("failed", {}).get(node)
        extra = f"  {node} {addresses[node]} {nodes.get(node, 'unknown')}" if node else ""
        if p["name"] == f"sshd-{login.NAME}":
            extra = f"  {login.NAME} {layout.login_address} (`ssh {login.NAME}` from here)"
        extra += f" (failed on purpose: {failed})" if failed else ""
        lines.append(f"  {p['name']:<14} pid {p['pid']:<8} {state}{extra}")
    if layout.network == "namespaces":
        daemon_pids = {p["pid"] for p in record["processes"]}
        others = {
            host: [pid for pid in pids if pid not in daemon_pids][:_MAX_NAMED]
            for host, pids in netns.processes(_names(record)).items()
        }
        named = _describe({host: pids for host, pids in others.items() if pids})
        lines.append(f"  other processes on the hosts: {named or 'none'}")
    return "\n".join(lines)
