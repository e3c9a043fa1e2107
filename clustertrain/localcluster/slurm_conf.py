"""The local cluster's configuration as text: slurm.conf, gres.conf, hosts files, and the name
server of the namespace network (dnsmasq.conf, the nodes' resolv.conf).

Pure functions: the values are data here, the templates (``templates/cluster/slurm.conf.j2``,
``templates/cluster/gres.conf.j2``, ...) hold layout only.
"""

from __future__ import annotations

from clustertrain.render.templates import CLUSTER_TEMPLATES as TEMPLATES
from clustertrain.render.templates import render_template

from . import accounting, rootfs
from .layout import Layout, conf_path, dns_conf, gpu_files, munge_socket

HOSTS_BEGIN = "# BEGIN clustertrain local cluster"
HOSTS_END = "# END clustertrain local cluster"
Line = list[tuple[str, str]]


def render_slurm_conf(layout: Layout, controller: str) -> str:
    """slurm.conf for ``layout``; ``controller`` is this host's short name (``hostname -s``)."""
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
        TEMPLATES,
        conf_path=str(conf_path(layout.state_dir)),
        settings=_settings(layout, controller),
        nodes=_nodes(layout),
        partitions=partitions,
    )


def _settings(layout: Layout, controller: str) -> Line:
    d = layout.state_dir
    return [
        ("ClusterName", "clustertrain"),
        ("SlurmctldHost", f"{controller}({layout.controller_address})"),
        ("SlurmctldPort", str(layout.base_port)),
        ("AuthType", "auth/munge"),
        ("AuthInfo", f"socket={munge_socket(d)}"),
        ("CredType", "cred/munge"),
        ("SlurmUser", "root"),
        ("SlurmdUser", "root"),
        ("StateSaveLocation", str(d / "spool" / "slurmctld")),
        ("SlurmdSpoolDir", str(d / "spool" / "%n")),
        ("SlurmctldPidFile", str(d / "run" / "slurmctld.pid")),
        ("SlurmdPidFile", str(d / "run" / "slurmd-%n.pid")),
        ("SlurmctldLogFile", str(d / "log" / "slurmctld.log")),
        ("SlurmdLogFile", str(d / "log" / "slurmd-%n.log")),
        # No cgroups and no systemd here (one host, no init system). task/affinity binds each
        # step to the CPUs it was granted, as sites do; with linuxproc it needs no cgroups.
        ("ProctrackType", "proctrack/linuxproc"),
        ("TaskPlugin", "task/affinity"),
        ("MpiDefault", "none"),
        ("SwitchType", "switch/none"),
        ("SelectType", "select/cons_tres"),
        ("SelectTypeParameters", "CR_Core"),
        ("GresTypes", "gpu"),
        # Every node declares the host's CPUs, which all nodes share; without this slurmd
        # compares them with the memory and sockets it detects and may call a node INVALID.
        ("SlurmdParameters", "config_overrides"),
        # Batch jobs start in 1-3 s instead of ~10 s.
        ("SchedulerParameters", "batch_sched_delay=0"),
        *accounting.slurm_conf_lines(layout),
        ("JobRequeue", "1"),
        ("ReturnToService", "2"),
        ("SlurmctldTimeout", "30"),
        # A node that stops answering is "not responding" (and no longer scheduled) after one
        # missed ping (every SlurmdTimeout/3 s), and DOWN with its jobs NODE_FAIL after it.
        ("SlurmdTimeout", str(layout.slurmd_timeout_s)),
        ("InactiveLimit", "0"),
        # scontrol show job still knows a job for an hour after it ends.
        ("MinJobAge", "3600"),
        # Seconds between SIGTERM and SIGKILL on scancel or time limit: keeps cancel quick.
        ("KillWait", "2"),
        ("MessageTimeout", "5"),
        *rootfs.slurm_conf_lines(layout.slurm),
    ]


def _nodes(layout: Layout) -> list[Line]:
    return [
        [
            ("NodeName", name),
            ("NodeAddr", address),
            ("NodeHostname", name),
            ("Port", str(port)),
            ("CPUs", str(layout.cpus_per_node)),
            ("RealMemory", str(layout.memory_mb_per_node)),
        ]
        + ([("Gres", f"gpu:{layout.gpus_per_node}")] if layout.gpus_per_node else [])
        + [("State", "UNKNOWN")]
        for (name, address), port in zip(
            layout.node_addresses.items(), layout.ports[1 : layout.nodes + 1], strict=True
        )
    ]


def render_oci_conf(layout: Layout) -> str:
    """oci.conf: Slurm's container support (``srun --container``) through runc, whose state
    lives in the cluster's run folder. The container is named for node, user, job, step, task."""
    runc = f"runc --root={layout.state_dir / 'run' / 'runc'}"
    name = "%n.%u.%j.%s.%t"
    settings = [
        ("RunTimeQuery", f"{runc} state {name}"),
        ("RunTimeKill", f"{runc} kill -a {name}"),
        ("RunTimeDelete", f"{runc} delete --force {name}"),
        ("RunTimeRun", f"exec {runc} run {name} -b %b"),
    ]
    return render_template("oci.conf.j2", TEMPLATES, settings=settings)


def render_gres_conf(layout: Layout) -> str:
    """gres.conf: each GPU is a device file; without ``File=`` Slurm drops the GPUs."""
    gres: list[Line] = [
        [("NodeName", node), ("Name", "gpu"), ("File", str(path))]
        for node in layout.node_names
        for path in gpu_files(layout, node)
    ]
    return render_template("gres.conf.j2", TEMPLATES, gres=gres)


def cluster_hosts(layout: Layout, controller: str) -> list[tuple[str, str]]:
    """(name, address) of the controller, then of every node and the login node (namespace
    network)."""
    return [(controller, layout.controller_address), *layout.host_addresses.items()]


def hosts_lines(layout: Layout, controller: str | None = None) -> list[str]:
    """Name to address for every node, and for the controller when named (namespaces only)."""
    if layout.network == "loopback":
        return [f"127.0.0.1 {' '.join(layout.node_names)}"]
    hosts = cluster_hosts(layout, controller) if controller else layout.node_addresses.items()
    return [f"{address} {name}" for name, address in hosts]


def render_dns_conf(layout: Layout, controller: str) -> str:
    """dnsmasq.conf: the cluster's name server on the bridge address, for the nodes.

    A node looks up the name of a peer's address (the TCPStore server does, for every client,
    given as ``::ffff:10.77.0.x``); glibc's hosts file lookup never matches an IPv4 line for
    that IPv6 form, so it asks DNS, as at a site. This server answers only the cluster's own
    names (A and PTR) and the subnet's reverse zone: no upstream server, nothing forwarded, so
    the nodes still reach nothing beyond their subnet. Other names get REFUSED, which glibc
    reports as the same temporary failure a node saw before (no route to the host's server).
    """
    d = layout.state_dir
    settings = [
        ("listen-address", layout.controller_address),
        # Without it dnsmasq binds the wildcard address on port 53 and filters by interface.
        ("bind-interfaces", ""),
        ("port", "53"),
        ("no-resolv", ""),
        ("no-poll", ""),
        ("no-hosts", ""),
        # No server after the prefix: the subnet's reverse zone is answered here only, so an
        # address of the subnet without a name is "no such name", not "try again".
        ("rev-server", layout.subnet),
        # The nodes' hosts files name these too; this answers their reverse lookups (a site's
        # DNS answers 127.0.0.1 with localhost).
        ("host-record", "localhost,127.0.0.1,::1"),
        *(
            ("host-record", f"{name},{address}")
            for name, address in cluster_hosts(layout, controller)
        ),
        ("pid-file", str(d / "run" / "dnsmasq.pid")),
        ("log-facility", str(d / "log" / "dnsmasq.log")),
    ]
    return render_template(
        "dnsmasq.conf.j2", TEMPLATES, conf_path=str(dns_conf(d)), settings=settings
    )


def render_node_resolv(layout: Layout) -> str:
    """/etc/resolv.conf as a node sees it: the cluster's name server on the bridge."""
    return (
        "# Generated by clustertrain for its local test cluster; do not edit.\n"
        f"nameserver {layout.controller_address}\n"
    )


def render_node_hosts(layout: Layout, controller: str) -> str:
    """/etc/hosts as a node sees it: localhost and the cluster, no ``127.0.1.1 host`` line."""
    base = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
    return hosts_with_block(base, hosts_lines(layout, controller))


def hosts_without_block(text: str) -> str:
    lines = text.splitlines(keepends=True)
    if HOSTS_BEGIN + "\n" not in lines:
        return text
    start = lines.index(HOSTS_BEGIN + "\n")
    end = lines.index(HOSTS_END + "\n", start) if HOSTS_END + "\n" in lines[start:] else start
    return "".join(lines[:start] + lines[end + 1 :])


def hosts_with_block(text: str, lines: list[str]) -> str:
    text = hosts_without_block(text)
    if text and not text.endswith("\n"):
        text += "\n"
    return text + "\n".join([HOSTS_BEGIN, *lines, HOSTS_END]) + "\n"
