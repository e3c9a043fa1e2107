"""The local cluster: the rendered config (pure), then the live cluster (marked slurm)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from clustertrain import localcluster as cluster
from clustertrain.errors import UserError
from clustertrain.localcluster import daemons
from clustertrain.localcluster.netns import Names
from tests.conftest import run_cli


def conf_lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_node_lines_have_own_port_and_loopback_address(tmp_path: Path) -> None:
    layout = cluster.Layout(
        nodes=2,
        cpus_per_node=8,
        gpus_per_node=2,
        base_port=7000,
        network="loopback",
        state_dir=tmp_path,
    )
    text = cluster.render_slurm_conf(layout, "host")
    assert conf_lines(text, "NodeName=") == [
        "NodeName=node1 NodeAddr=127.0.0.1 NodeHostname=node1 Port=7001 CPUs=8"
        " RealMemory=4096 Gres=gpu:2 State=UNKNOWN",
        "NodeName=node2 NodeAddr=127.0.0.1 NodeHostname=node2 Port=7002 CPUs=8"
        " RealMemory=4096 Gres=gpu:2 State=UNKNOWN",
    ]
    assert conf_lines(text, "PartitionName=") == [
        "PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP"
    ]
    for setting in [
        "SlurmctldHost=host(127.0.0.1)",
        "SlurmctldPort=7000",
        "SlurmdParameters=config_overrides",
        "SchedulerParameters=batch_sched_delay=0",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/affinity",
        "JobRequeue=1",
        f"AuthInfo=socket={tmp_path}/munge/munged.socket",
        f"JobCompLoc={tmp_path}/spool/jobcomp.log",
    ]:
        assert setting in text.splitlines()


def test_namespace_nodes_have_own_addresses_and_hosts_files(tmp_path: Path) -> None:
    layout = cluster.Layout(nodes=3, subnet="10.99.5.0/24", state_dir=tmp_path)
    text = cluster.render_slurm_conf(layout, "login")
    assert "SlurmctldHost=login(10.99.5.1)" in text.splitlines()
    assert [line.split()[1] for line in conf_lines(text, "NodeName=")] == [
        "NodeAddr=10.99.5.2",
        "NodeAddr=10.99.5.3",
        "NodeAddr=10.99.5.4",
    ]
    hosts = cluster.render_node_hosts(layout, "login").splitlines()
    assert hosts[0] == "127.0.0.1 localhost"
    assert "10.99.5.1 login" in hosts and "10.99.5.4 node3" in hosts
    # Debian's "127.0.1.1 <hostname>" line is what breaks rendezvous: a node's view has none.
    assert not [line for line in hosts if line.startswith("127.0.1.1")]


def test_the_name_server_answers_the_cluster_on_the_bridge_only(tmp_path: Path) -> None:
    layout = cluster.Layout(nodes=3, subnet="10.99.0.0/20", state_dir=tmp_path)
    text = cluster.render_dns_conf(layout, "login")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    for setting in [
        "listen-address=10.99.0.1",  # the bridge (controller) address, and no other
        "bind-interfaces",
        "port=53",
        "no-resolv",
        "no-hosts",
        "rev-server=10.99.0.0/20",  # no server after it: the reverse zone is answered here
        f"pid-file={tmp_path}/run/dnsmasq.pid",
    ]:
        assert setting in lines
    # Nothing forwarded, no interface but the bridge address's: the nodes still reach nothing
    # beyond their subnet, and nothing else on this machine is served.
    assert not [line for line in lines if line.split("=")[0] in ("server", "interface")]
    assert conf_lines(text, "listen-address=") == ["listen-address=10.99.0.1"]
    # The same names as the nodes' hosts files, each one way and back.
    records = [line.split("=", 1)[1] for line in conf_lines(text, "host-record=")]
    hosts = cluster.render_node_hosts(layout, "login").splitlines()
    named = [line.split() for line in hosts[hosts.index(cluster.slurm_conf.HOSTS_BEGIN) + 1 : -1]]
    assert records == ["localhost,127.0.0.1,::1"] + [f"{name},{addr}" for addr, name in named]
    assert cluster.render_node_resolv(layout).splitlines()[1:] == ["nameserver 10.99.0.1"]


def test_dnsmasq_accepts_the_rendered_config(tmp_path: Path) -> None:
    dnsmasq = daemons.which("dnsmasq")
    if dnsmasq is None:
        pytest.skip("dnsmasq is not installed (clustertrain cluster up installs it)")
    conf = tmp_path / "dnsmasq.conf"
    conf.write_text(cluster.render_dns_conf(cluster.Layout(state_dir=tmp_path), "login"))
    done = subprocess.run(
        [dnsmasq, "--test", f"--conf-file={conf}"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "syntax check OK" in done.stderr, done.stderr


def test_namespace_nodes_get_the_name_server_and_loopback_nodes_the_hosts(tmp_path: Path) -> None:
    layout = cluster.Layout(nodes=2, state_dir=tmp_path)
    names = Names("0123456789abcdef", layout.node_names)
    started = dict(daemons.commands(layout, names))
    # The database, then slurmdbd, before slurmctld: it registers with slurmdbd as it starts.
    assert list(started) == [
        "munged", "mariadb", "slurmdbd", "slurmctld", "dnsmasq", "slurmd-node1", "slurmd-node2",
        "sshd-login",
    ]  # fmt: skip
    assert "--skip-networking" in started["mariadb"]  # a Unix socket only: no port of its own
    sshd = started["sshd-login"]
    assert sshd[sshd.index("-c") + 2] == "login"  # its own hostname, hosts file and resolv.conf
    assert sshd[-5:] == [sshd[-5], "-D", "-e", "-f", f"{tmp_path}/ssh/sshd_config"]
    assert f"--conf-file={tmp_path}/dnsmasq.conf" in started["dnsmasq"]
    slurmd = started["slurmd-node2"]
    script = slurmd[slurmd.index("-c") + 1]
    assert 'mount --bind "$2" /etc/resolv.conf' in script
    assert slurmd[slurmd.index("-c") + 2 : slurmd.index("-c") + 5] == [
        "node2",
        f"{tmp_path}/hosts/node2",
        f"{tmp_path}/resolv.conf",
    ]
    assert slurmd[-6:] == [slurmd[-6], "-D", "-N", "node2", "-f", f"{tmp_path}/slurm.conf"]
    # On 127.0.0.1 every node is this host: its own resolver answers, as for any process here.
    loopback = cluster.Layout(nodes=2, network="loopback", state_dir=tmp_path, accounting=False)
    assert [name for name, _ in daemons.commands(loopback, names)] == [
        "munged",
        "slurmctld",
        "slurmd-node1",
        "slurmd-node2",
    ]


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"network": "bridge"}, "network"),
        ({"subnet": "10.77.0.0/33"}, "subnet"),
        ({"subnet": "8.8.8.0/24"}, "subnet"),  # not ours: only a private range
        ({"subnet": "10.77.0.0/29", "nodes": 5}, "subnet"),  # no room for 7 hosts
    ],
)
def test_bad_network_is_a_user_error(fields: dict[str, object], field: str) -> None:
    with pytest.raises(UserError, match=field):
        cluster.Layout(**fields)  # type: ignore[arg-type]


def test_network_names_fit_the_kernel_and_differ_per_cluster() -> None:
    from clustertrain.localcluster.netns import Names

    one, two = Names("a1b2c3d4", ["node1", "node64"]), Names("ffee0011", ["node1"])
    kernel_names = [one.bridge, one.host_link("node64"), two.bridge, two.host_link("node1")]
    assert all(len(name) <= 15 for name in kernel_names)
    assert len(set(kernel_names)) == 4
    assert one.namespace("node1") != two.namespace("node1")


def test_gres_lines_name_one_device_file_per_gpu(tmp_path: Path) -> None:
    layout = cluster.Layout(nodes=2, gpus_per_node=2, state_dir=tmp_path)
    text = cluster.render_gres_conf(layout)
    assert "AutoDetect=off" in text.splitlines()
    assert conf_lines(text, "NodeName=") == [
        f"NodeName=node{n} Name=gpu File={tmp_path}/gpu/node{n}/gpu{i}"
        for n in (1, 2)
        for i in (0, 1)
    ]


def test_no_gpus_means_no_gres(tmp_path: Path) -> None:
    layout = cluster.Layout(nodes=1, gpus_per_node=0, state_dir=tmp_path)
    assert "Gres=" not in cluster.render_slurm_conf(layout, "host")
    assert conf_lines(cluster.render_gres_conf(layout), "NodeName=") == []


@pytest.mark.parametrize(
    "field, value", [("nodes", 0), ("cpus_per_node", -1), ("gpus_per_node", 1.5), ("base_port", 80)]
)
def test_bad_layout_is_a_user_error(field: str, value: object) -> None:
    with pytest.raises(UserError, match=field):
        cluster.Layout(**{field: value})  # type: ignore[arg-type]


def test_hosts_block_is_added_once_and_removed_exactly() -> None:
    original = "127.0.0.1 localhost\n::1 ip6-localhost"
    added = cluster.hosts_with_block(original, ["127.0.0.1 node1 node2"])
    assert cluster.hosts_with_block(added, ["127.0.0.1 node1 node2"]) == added
    assert "127.0.0.1 node1 node2\n" in added
    assert cluster.hosts_without_block(added) == original + "\n"
    assert cluster.hosts_without_block(original) == original


def test_down_and_status_without_a_cluster(tmp_path: Path) -> None:
    cluster.down(tmp_path)
    cluster.down(tmp_path)
    assert "down" in cluster.status(tmp_path)


# --- on the live cluster (CI brings it up with `clustertrain cluster up` first) ---------------


@pytest.fixture
def live() -> cluster.Layout:
    layout = cluster.current_layout(cluster.default_state_dir())
    if layout is None:
        pytest.skip("no local cluster is up: run `clustertrain cluster up`")
    return layout


def slurm(*args: str) -> str:
    conf = cluster.local_slurm_conf()
    env = {**os.environ, "SLURM_CONF": str(conf)}
    return subprocess.run(
        args, env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout


@pytest.mark.slurm
@pytest.mark.every_slurm
def test_the_cluster_runs_the_slurm_it_says(live: cluster.Layout) -> None:
    """The daemons and the commands on PATH (what clustertrain and submitit run) are the
    layout's Slurm: 24.11 refuses a 22.05 client, so a mix would not get this far."""
    assert slurm("sinfo", "--version").split()[-1].startswith(f"{live.slurm}.")
    config = slurm("scontrol", "show", "config")
    assert re.search(rf"^SLURM_VERSION\s*=\s*{re.escape(live.slurm)}\.", config, re.M), config
    assert f"Slurm {live.slurm}" in cluster.status(live.state_dir)


@pytest.mark.slurm
@pytest.mark.every_slurm
def test_every_node_is_up(live: cluster.Layout) -> None:
    states = dict(line.split() for line in slurm("sinfo", "-h", "-N", "-o", "%N %T").splitlines())
    assert sorted(states) == sorted(live.node_names)
    # Other tests' jobs may hold some nodes; a node that is down or invalid is not in this list.
    assert set(states.values()) <= {"idle", "mixed", "allocated", "completing"}


@pytest.mark.slurm
@pytest.mark.every_slurm
def test_srun_reaches_two_nodes(live: cluster.Layout) -> None:
    out = slurm("srun", "-N2", "-l", "printenv", "SLURMD_NODENAME")
    assert sorted(out.split()) == ["0:", "1:", "node1", "node2"]


@pytest.mark.slurm
@pytest.mark.every_slurm
def test_batch_job_gets_its_gpus(live: cluster.Layout, tmp_path: Path) -> None:
    if live.gpus_per_node < 2:
        pytest.skip("needs 2 GPUs per node")
    out = tmp_path / "out.txt"
    slurm(
        "sbatch",
        "--wait",
        "-N1",
        "--gpus-per-node=2",
        f"--output={out}",
        "--wrap",
        "echo CUDA=$CUDA_VISIBLE_DEVICES",
    )
    assert out.read_text().strip() == "CUDA=0,1"


@pytest.mark.slurm
def test_up_when_up_changes_nothing(live: cluster.Layout) -> None:
    record = live.state_dir / "state.json"
    before = record.read_text()
    assert cluster.up(live) == str(cluster.local_slurm_conf())
    assert record.read_text() == before


@pytest.mark.slurm
@pytest.mark.every_slurm
def test_the_login_node_is_reached_by_ssh_and_has_slurm_and_clustertrain(
    live: cluster.Layout,
) -> None:
    """The system's ssh client, through ~/.ssh/config's Include line, to Debian's sshd in the
    login node's namespace: its own hostname, Slurm's client configuration and clustertrain."""
    if live.network != "namespaces":
        pytest.skip("the login node needs the namespace layout")

    def ssh(command: str) -> str:
        argv = ["ssh", "-o", "BatchMode=yes", "login", command]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert ssh("hostname") == "login"
    assert ssh("hostname -I").split() == [live.login_address]
    assert ssh("sinfo -h -o %D") == str(live.nodes)
    assert ssh("clustertrain --version") == run_cli("--version").stdout.strip()


def _in_network(inode: int) -> list[str]:
    """Every live process whose network namespace is ``inode``, as ``PID (comm)``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "ns" / "net") == f"net:[{inode}]":
                found.append(f"{proc.name} ({(proc / 'comm').read_text().strip()})")
        except OSError:
            continue
    return found


@pytest.mark.slurm
def test_down_leaves_no_process_of_the_login_nodes_namespace(live: cluster.Layout) -> None:
    """After `--host login` work (a master connection, its sshd session on the login node),
    `cluster down` ends every process of the login node, by PID, before its namespace goes;
    `cluster status` named them while they ran."""
    if live.network != "namespaces":
        pytest.skip("the login node needs the namespace layout")
    assert run_cli("doctor", "--host", "login").returncode == 0
    (space,) = Path("/run/netns").glob("clustertrain-*-login")
    inode = space.stat().st_ino
    sessions = [p for p in _in_network(inode) if p.endswith("(sshd)")]
    assert len(sessions) >= 2, sessions  # sshd itself and the master connection's session
    status = run_cli("cluster", "status").stdout
    assert "other processes on the hosts: login: pid " in status, status
    try:
        down = run_cli("cluster", "down")
        assert down.returncode == 0, down.stderr
        assert _in_network(inode) == []
    finally:
        cluster.up(live)
    assert "other processes on the hosts: none" in run_cli("cluster", "status").stdout


@pytest.mark.slurm
def test_down_leaves_no_queue_discipline_or_cgroup_of_a_degraded_node(live: cluster.Layout) -> None:
    """`cluster degrade` puts a tbf queue on both ends of a node's link and its processes in a
    cpu cgroup with a quota; `cluster down` removes both, even without `heal`."""
    if live.network != "namespaces":
        pytest.skip("degrade needs the namespace layout")
    degraded = run_cli("cluster", "degrade", "node4", "--link-rate", "10mbit", "--cpu", "50%")
    assert degraded.returncode == 0, degraded.stderr
    groups = lambda: [*Path("/sys/fs/cgroup/cpu").glob("clustertrain-*-node4-slow"),  # noqa: E731
                      *Path("/sys/fs/cgroup").glob("clustertrain-*-node4-slow")]  # fmt: skip
    qdiscs = lambda: subprocess.run(["tc", "qdisc", "show"], capture_output=True,  # noqa: E731
                                    text=True, check=True).stdout  # fmt: skip
    assert groups() and " tbf " in qdiscs()
    try:
        down = run_cli("cluster", "down")
        assert down.returncode == 0, down.stderr
        assert groups() == [] and " tbf " not in qdiscs()
    finally:
        cluster.up(live)


def test_down_names_a_process_that_outlives_it_and_keeps_the_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process SIGKILL cannot end (stuck in the kernel) keeps the namespaces, so that it can
    still be found: down (and up, which runs it first) says which, in one line."""
    from clustertrain.localcluster import lifecycle, netns

    me = os.getpid()
    stopped: list[list[dict]] = []
    monkeypatch.setattr(lifecycle.netns, "processes", lambda names: {"login": [me]})
    monkeypatch.setattr(lifecycle.daemons, "stop", lambda procs, grace_s: stopped.append(procs))
    monkeypatch.setattr(lifecycle.ssh, "stop_master", lambda host: None)
    with pytest.raises(UserError, match=rf"^processes are left .*: login: pid {me} \(\w+\); "):
        lifecycle._end_hosts(netns.Names("0123456789abcdef", ["node1", "login"]))
    assert [[p["pid"] for p in procs] for procs in stopped] == [[me]]


def test_the_login_nodes_ssh_files(tmp_path: Path) -> None:
    from clustertrain.localcluster import login

    layout = cluster.Layout(nodes=2, subnet="10.99.7.0/24", state_dir=tmp_path)
    sshd = login.render_sshd_config(layout).splitlines()
    assert "ListenAddress 10.99.7.4:22" in sshd  # after the controller and the nodes
    assert f"AuthorizedKeysFile {tmp_path}/ssh/authorized_keys" in sshd
    # Another user's own keys, never root's: the Match block is last, as sshd requires.
    assert sshd[-2:] == ["Match User *,!root", "    AuthorizedKeysFile .ssh/authorized_keys"]
    assert "PasswordAuthentication no" in sshd and "KbdInteractiveAuthentication no" in sshd
    client = login.render_client_config(layout)
    assert "Host login\n    HostName 10.99.7.4\n" in client
    assert f"UserKnownHostsFile {tmp_path}/ssh/known_hosts" in client
    assert "StrictHostKeyChecking yes" in client
    # Another cluster's Include line is left alone; this one's goes, wherever it is.
    other = f'{login.INCLUDE_MARK}\nInclude "/elsewhere/ssh/config"\n'
    ours = f'{login.INCLUDE_MARK}\nInclude "{tmp_path}/ssh/config"\n'
    text = f"{other}{ours}Host *\n    ServerAliveInterval 30\n"
    assert login.without_include(text, tmp_path) == f"{other}Host *\n    ServerAliveInterval 30\n"
    assert login.without_include(text, tmp_path / "x") == text


# --- private clusters beside the shared one (own state folder, ports and subnet) -------------


def _private(tmp_path: Path, nodes: int, subnet: str) -> cluster.Layout:
    if os.geteuid() != 0 or cluster.current_layout(cluster.default_state_dir()) is None:
        pytest.skip("needs root and the local cluster's packages (clustertrain cluster up)")
    return cluster.Layout(
        nodes=nodes, cpus_per_node=1, gpus_per_node=0, base_port=18817, subnet=subnet,
        state_dir=tmp_path / "cluster", accounting=False,  # a site without slurmdbd, tested too
    )  # fmt: skip


@pytest.mark.slurm
def test_down_removes_every_namespace_and_link_after_a_crash(tmp_path: Path) -> None:
    import json
    import signal

    from clustertrain.localcluster.netns import Names, leftovers

    layout = _private(tmp_path, 2, "10.77.2.0/24")
    ssh_config = Path.home() / ".ssh" / "config"
    before = ssh_config.read_text() if ssh_config.exists() else None
    cluster.up(layout)
    record = json.loads((layout.state_dir / "state.json").read_text())
    names = Names(record["id"], list(layout.host_addresses))
    assert len(leftovers(names)) == 7  # the bridge; 2 nodes and login: 3 links, 3 namespaces
    ours = f'Include "{layout.state_dir / "ssh" / "config"}"'
    assert ours in ssh_config.read_text().splitlines()[:2]  # first: it applies to every host
    for proc in record["processes"]:  # the crash: every daemon killed at once
        os.kill(proc["pid"], signal.SIGKILL)
    cluster.down(layout.state_dir)
    assert leftovers(names) == []
    # Its Include line is gone; the shared cluster's stays.
    assert (ssh_config.read_text() if ssh_config.exists() else None) == before
    assert "down" in cluster.status(layout.state_dir)


@pytest.mark.slurm
@pytest.mark.slow
def test_a_16_node_job_completes_on_16_separate_hosts(tmp_path: Path) -> None:
    import json
    import re

    from tests.conftest import run_cli

    layout = _private(tmp_path, 16, "10.77.3.0/24")
    conf = cluster.up(layout)
    try:
        env = {"SLURM_CONF": conf, "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
        done = run_cli(
            "submit", "--launcher", "torchrun", "--script", "tests/jobs/hello_world.py",
            "--nodes", "16", "--gpus-per-node", "0", "--cpus-per-task", "1", env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        job_id = re.search(r"submitted job (\d+)", done.stdout)[1]  # type: ignore[index]
        followed = run_cli("logs", job_id, "--follow", env=env, timeout=600)
        assert followed.returncode == 0, followed.stdout[-3000:]
        ranks = [json.loads(m) for m in re.findall(r"hello-world (\{.*\})", followed.stdout)]
        assert sorted(r["rank"] for r in ranks) == list(range(16))
        assert {r["world"] for r in ranks} == {16} and {r["gloo_ifname"] for r in ranks} == {"eth0"}
        assert {r["hostname"] for r in ranks} == set(layout.node_names)
        assert {r["head_address"] for r in ranks} == {layout.node_addresses["node1"]}
    finally:
        cluster.down(layout.state_dir)


def test_the_include_line_goes_and_a_users_own_config_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clustertrain.localcluster import login

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = tmp_path / "home" / ".ssh" / "config"
    state = tmp_path / "state dir"  # a space: the Include path is quoted
    assert login.include(state) is True
    assert config.read_text().splitlines()[1] == f'Include "{state}/ssh/config"'
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    login.exclude(state, made=True)
    assert not config.exists()  # it made the file for its line alone
    config.write_text("")  # the user's own, empty
    assert login.include(state) is False
    login.exclude(state, made=False)
    assert config.exists() and config.read_text() == ""
