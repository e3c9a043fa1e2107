"""What a job sees on the local cluster's default layout, as it would at a site: every node a
host of its own (hostname, address, hosts file), ranks talking over the bridge, CPUs bound to
what the step was granted, and a node with a broken hosts view stopped in seconds by name."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from clustertrain import localcluster as local
from tests.conftest import run_cli
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm
SCRIPT = "tests/jobs/where_am_i.py"


@pytest.fixture
def layout(cluster: None) -> local.Layout:  # noqa: F811
    found = local.current_layout(local.default_state_dir())
    assert found is not None
    if found.network != "namespaces":
        pytest.skip("the local cluster runs the loopback layout (cluster up --layout loopback)")
    return found


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}


def _ranks(env: dict[str, str], *flags: str) -> tuple[list[dict], str, Path]:
    job_id, run_dir = submit(env, "--launcher", "torchrun", "--script", SCRIPT, *flags)
    done = run_cli("logs", job_id, "--follow", env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    seen = [json.loads(m) for m in re.findall(r"where-am-i (\{.*\})", done.stdout)]
    return sorted(seen, key=lambda r: r["rank"]), done.stdout, run_dir


def test_each_node_is_its_own_host_and_ranks_talk_over_the_bridge(
    layout: local.Layout, env: dict[str, str]
) -> None:
    ranks, out, _ = _ranks(env, "--nodes", "3", "--gpus-per-node", "0", "--cpus-per-task", "1")
    assert [r["sum"] for r in ranks] == [3, 3, 3], out[-3000:]
    addresses = layout.node_addresses
    assert [r["hostname"] for r in ranks] == [r["slurm_node"] for r in ranks]
    assert len({r["hostname"] for r in ranks}) == 3
    head = ranks[0]["slurm_node"]
    # Every node resolves the head node to its bridge address, and trains over eth0.
    assert {r["head_address"] for r in ranks} == {addresses[head]}
    assert {(r["gloo_ifname"], r["nccl_ifname"]) for r in ranks} == {("eth0", "eth0")}
    for rank in ranks:
        assert rank["peers"], rank
        assert not [p for p in rank["peers"] if p.startswith("127.")], rank
        assert set(rank["peers"]) <= set(addresses.values()), rank
    # The non-head ranks reach the head over the bridge (its store and gloo).
    assert all(addresses[head] in r["peers"] for r in ranks[1:])
    assert "interface to it: " in out and "=eth0" in out


def test_a_node_names_its_peers_and_no_launcher_or_rank_warns_it_cannot(
    layout: local.Layout, env: dict[str, str]
) -> None:
    """The TCPStore server asks the name of every client's address (``::ffff:10.77.0.x``); a
    node that cannot answer prints "The hostname of the client socket cannot be retrieved"
    from every launcher and rank, as it does where the host's name server is out of reach."""
    ranks, out, run_dir = _ranks(
        env, "--nodes", "2", "--gpus-per-node", "0", "--cpus-per-task", "1"
    )
    assert len(ranks) == 2, out[-3000:]
    logs = [path for path in (run_dir / "logs").rglob("*") if path.is_file()]
    assert any(path.name == "node1.err" for path in logs), logs
    warned = [
        f"{path}: {line}"
        for path in logs
        for line in path.read_text(errors="replace").splitlines()
        if "hostname of the client socket cannot be retrieved" in line
    ]
    assert not warned, "\n".join(warned)
    # Each node names its peer's address, and that name still resolves to the bridge address
    # alone (the hosts file's answer: forward lookups are as they were).
    name_of = {address: node for node, address in layout.node_addresses.items()}
    for rank in ranks:
        assert rank["peer_names"] and set(rank["peer_names"]) == set(rank["peers"]), rank
        assert rank["peer_names"] == {
            address: {"name": name_of[address], "addresses": [address]} for address in rank["peers"]
        }, rank


@pytest.mark.parametrize(("cpus", "procs", "threads"), [(1, 1, 1), (2, 1, 2), (2, 2, 1)])
def test_a_rank_gets_the_cpus_its_step_was_granted(
    layout: local.Layout, env: dict[str, str], cpus: int, procs: int, threads: int
) -> None:
    flags = ["--nodes", "2", "--gpus-per-node", "0", "--procs-per-node", str(procs)]
    ranks, out, _ = _ranks(env, *flags, "--cpus-per-task", str(cpus))
    assert len(ranks) == 2 * procs, out[-3000:]
    assert {len(r["cpus"]) for r in ranks} == {cpus}, ranks
    assert {r["threads"] for r in ranks} == {threads}, ranks


def test_srun_binds_a_one_cpu_step_to_one_cpu(layout: local.Layout) -> None:
    env = {"SLURM_CONF": str(local.local_slurm_conf()), "PATH": "/usr/bin:/bin"}
    probe = "import os; print(len(os.sched_getaffinity(0)))"
    one = subprocess.run(
        ["srun", "-N1", "-c1", "python3", "-c", probe], env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert one.stdout.split() == ["1"]


@pytest.fixture
def broken_node(layout: local.Layout) -> Iterator[tuple[str, str]]:
    """node2's hosts view maps the head node to Debian's 127.0.1.1; restored afterwards.

    Written in place: each node's /etc/hosts is a bind mount of its file, which a rename would
    leave behind."""
    path = layout.state_dir / "hosts" / "node2"
    original = path.read_text()
    path.write_text(original.replace(f"{layout.node_addresses['node1']} node1", "127.0.1.1 node1"))
    try:
        yield "node2", "127.0.1.1"
    finally:
        path.write_text(original)


def test_a_node_resolving_the_head_to_loopback_ends_the_job_naming_it(
    layout: local.Layout, env: dict[str, str], broken_node: tuple[str, str]
) -> None:
    node, address = broken_node
    job_id, run_dir = submit(
        env, "--launcher", "torchrun", "--script", SCRIPT, "--nodes", str(layout.nodes),
        "--gpus-per-node", "0", "--cpus-per-task", "1",
    )  # fmt: skip
    done = run_cli("logs", job_id, "--follow", env=env, timeout=300)
    assert done.returncode != 0
    assert f"node check failed: {node}: resolves the head node node1 to the loopback " in (
        done.stdout
    ), done.stdout[-2000:]
    assert address in done.stdout and "where-am-i" not in done.stdout
    # It stopped before any launcher started: no node wrote a log of its ranks.
    assert not list((run_dir / "logs" / "attempt-0").glob("node*.out"))


# A site's setup lines ---------------------------------------------------------------------------
# tests/jobs/site_setup.py needs SITE_DATA_ROOT, as a training script needs what a site's module
# or environment gives it; only a setup line of the job sets it.
SETUP_JOB = """\
script: tests/jobs/site_setup.py
launcher: torchrun
nodes: 2
gpus_per_node: 0
cpus_per_task: 1
"""


def _job_file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_setup_line_gives_the_job_what_it_needs_and_without_it_the_job_fails_in_one_line(
    cluster: None,  # noqa: F811
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    with_line = SETUP_JOB + "setup: ['export SITE_DATA_ROOT=/shared/site-data']\n"
    job_id, _ = submit(env, _job_file(tmp_path, "with.yaml", with_line))
    done = run_cli("logs", job_id, "--follow", env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert done.stdout.count("reads /shared/site-data") == 2, done.stdout[-3000:]

    job_id, _ = submit(env, _job_file(tmp_path, "without.yaml", SETUP_JOB))
    done = run_cli("logs", job_id, "--follow", env=env, timeout=300)
    assert done.returncode != 0
    assert "site-setup: SITE_DATA_ROOT is not set" in done.stdout, done.stdout[-3000:]
    assert "FAILED" in run_cli("status", job_id, env=env).stdout


def test_a_setup_line_that_fails_ends_the_job_in_one_line_before_any_rank(
    cluster: None,  # noqa: F811
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    lines = "setup: ['export SITE_DATA_ROOT=/shared/site-data', 'test -d /no/such/site/folder']\n"
    job_id, run_dir = submit(env, _job_file(tmp_path, "failing.yaml", SETUP_JOB + lines))
    done = run_cli("logs", job_id, "--follow", env=env, timeout=300)
    assert done.returncode != 0
    said = "clustertrain: setup line 2 failed (exit 1): test -d /no/such/site/folder"
    assert said in done.stdout, done.stdout[-3000:]
    assert "site-setup:" not in done.stdout  # no rank started
    assert not list((run_dir / "logs").rglob("node*.out"))  # nor any launcher


def test_your_sites_file_gives_every_job_on_this_cluster_its_setup_line(
    cluster: None,  # noqa: F811
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    """The entry named by the local cluster's ClusterName (clustertrain), read by `submit`."""
    config = tmp_path / "config"
    (config / "clustertrain").mkdir(parents=True)
    (config / "clustertrain" / "sites.yaml").write_text(
        "clustertrain:\n  setup: ['export SITE_DATA_ROOT=/from/site/defaults']\n"
    )
    env = {**env, "XDG_CONFIG_HOME": str(config)}
    job_file = _job_file(tmp_path, "plain.yaml", SETUP_JOB)
    dry = run_cli("submit", job_file, "--dry-run", env=env)
    assert "setup: 1 line(s), in the script below  (site defaults: clustertrain)" in dry.stdout
    job_id, _ = submit(env, job_file)
    done = run_cli("logs", job_id, "--follow", env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert done.stdout.count("reads /from/site/defaults") == 2, done.stdout[-3000:]


def test_the_default_cpus_per_gpu_is_fitted_to_the_nodes_and_each_rank_gets_them(
    layout: local.Layout, env: dict[str, str]
) -> None:
    """4 CPUs per GPU, cut to what a node has for its GPUs (a 2-core machine's nodes: 1 per
    GPU); the step gets them too (srun --cpus-per-gpu), shared by the node's 2 ranks."""
    if not layout.gpus_per_node:
        pytest.skip("the local cluster's nodes have no GPUs (cluster up --gpus-per-node 0)")
    per_gpu = max(1, min(4, layout.cpus_per_node // layout.gpus_per_node))
    flags = ["--nodes", "2", "--gpus-per-node", str(layout.gpus_per_node)]
    ranks, out, run_dir = _ranks(env, *flags)
    assert f"#SBATCH --cpus-per-gpu={per_gpu}\n" in (run_dir / "job.sbatch").read_text()
    assert len(ranks) == 2 * layout.gpus_per_node, out[-3000:]
    assert {len(r["cpus"]) for r in ranks} == {per_gpu * layout.gpus_per_node}, ranks
