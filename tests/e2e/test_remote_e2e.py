"""Submitting from this machine (the "laptop") to the local cluster's login node over the
system's ssh and Debian's sshd: a code snapshot sent once, the job queued and prepared there,
its logs followed from here through a dropped connection, status and cancel from here."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clustertrain import localcluster as local
from clustertrain import protocol
from clustertrain.backends.remote import ssh
from tests.conftest import ROOT, run_cli
from tests.e2e.test_slurm_e2e import SMOKE, cluster  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm
HOST = "login"
REMOTE_HOME = Path.home()  # the login node sees this machine's files, its home among them


@pytest.fixture
def tree(cluster: None, tmp_path: Path) -> Iterator[Path]:  # noqa: F811
    """A clone of this project with a commit of its own (a snapshot no other test sent)."""
    layout = local.current_layout(local.default_state_dir())
    if layout is None or layout.network != "namespaces":
        pytest.skip("the login node needs the namespace layout")
    tree = tmp_path / "laptop"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tree)], check=True)
    (tree / "NOTE").write_text(f"{uuid.uuid4()}\n")
    _git(tree, "add", "NOTE")
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a snapshot")
    kept = [REMOTE_HOME / ".clustertrain" / sub for sub in ("code", "runs")]
    before = {path for folder in kept for path in folder.glob("*")}
    yield tree
    ssh.stop_master(HOST)  # the master connection ControlPersist keeps
    for made in {path for folder in kept for path in folder.glob("*")} - before:
        shutil.rmtree(made)  # what the tests sent and ran on the login node


def _git(tree: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True)


def _submit(tree: Path, env: dict[str, str], *args: str) -> tuple[str, Path, str]:
    done = run_cli("submit", "--host", HOST, *args, cwd=tree, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    job_id = re.search(r"submitted job (\d+)", done.stdout)[1]  # type: ignore[index]
    here = Path(re.search(r"here: (\S+)", done.stdout)[1])  # type: ignore[index]
    return job_id, here, done.stdout


def _by_source(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        found.setdefault(line.partition(" | ")[0].partition(" ! ")[0], []).append(line)
    return found


@pytest.fixture
def env(tmp_path: Path, data_dir: Path) -> dict[str, str]:
    return {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}


def _mnist(data_dir: Path, *train: str) -> list[str]:
    """The MNIST job, its data where this machine keeps it: the login node sees this machine's
    files but not its environment (CLUSTERTRAIN_DATA_DIR), so the folder is said on the line."""
    job = ["jobs/mnist.yaml", "--nodes", "2", "--gpus-per-node", "1"]
    job += ["--prepare", f"python -m jobs.mnist.data --data-dir {shlex.quote(str(data_dir))}"]
    return [*job, "--", "--strategy", "ddp", "--data-dir", str(data_dir), *train]


@pytest.mark.every_slurm
def test_a_job_submitted_over_ssh_completes_and_is_followed_here_through_a_dropped_link(
    tree: Path, env: dict[str, str], data_dir: Path
) -> None:
    job_id, here, said = _submit(tree, env, *_mnist(data_dir, *SMOKE))
    assert f"code: sent in {HOST}:~/.clustertrain/code/" in said
    assert "prepare | " in said  # the prepare step ran there, its output streamed here
    remote = (here / protocol.REMOTE_FILE).read_text()
    assert f'"host": "{HOST}"' in remote and str(REMOTE_HOME / ".clustertrain/runs") in remote

    follow = subprocess.Popen(
        [sys.executable, "-P", "-m", "clustertrain", "logs", "last", "--follow"], cwd=tree,
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert follow.stdout is not None
    first = [follow.stdout.readline() for _ in range(3)]  # it streams: the link is up
    ssh.stop_master(HOST)  # the connection drops mid-follow
    # The same buffered reader as the first lines (communicate would skip what it holds).
    rest = follow.stdout.read()
    err = follow.stderr.read() if follow.stderr else ""
    follow.wait(timeout=300)
    followed = "".join(first) + rest
    assert follow.returncode == 0, followed[-2000:] + err
    assert "connecting again" in err and f"job {job_id} ended COMPLETED" in err

    # Not a line lost or repeated: each source's lines (a node's rank, a launcher, the batch
    # shell), in order, are what the logs hold; only sources interleave differently live.
    logged = run_cli("logs", "last", cwd=tree, env=env).stdout
    assert _by_source(followed) == _by_source(logged)
    status = run_cli("status", "last", cwd=tree, env=env).stdout
    assert f"job {job_id} (mnist-ddp): COMPLETED" in status and "final test_acc 0." in status

    # plot fetches the events and metrics and draws here.
    drawn = run_cli("plot", "last", "-o", str(here / "remote.png"), cwd=tree, env=env)
    assert drawn.returncode == 0, drawn.stderr
    assert (here / "remote.png").read_bytes().startswith(b"\x89PNG")
    assert (here / protocol.EVENTS_FILE).is_file() and not (here / protocol.LOGS_DIR).exists()

    # The same tree again: no code is sent.
    again = run_cli(
        "submit", "--host", HOST, "--dry-run", *_mnist(data_dir, *SMOKE), cwd=tree, env=env
    )
    assert again.returncode == 0, again.stderr
    assert f"code: already in {HOST}:~/.clustertrain/code/" in again.stdout
    assert "#SBATCH --nodes=2" in again.stdout  # rendered there, queued nowhere
    assert len(list(here.parent.iterdir())) == 1  # and recorded nowhere here


def test_a_dirty_tree_is_refused_and_sent_as_it_is_with_allow_dirty(
    tree: Path, env: dict[str, str]
) -> None:
    (tree / "hello_dirty.py").write_text("print('dirty hello from', __import__('os').uname()[1])\n")
    (tree / "secret.env").write_text("TOKEN=1\n")
    (tree / ".git" / "info" / "exclude").write_text("secret.env\n")
    args = ["--script", "hello_dirty.py", "--nodes", "1", "--cpus-per-task", "1", "--no-prepare"]
    refused = run_cli("submit", "--host", HOST, *args, cwd=tree, env=env)
    assert refused.returncode == 2
    assert "working tree: 1 uncommitted change(s)" in refused.stderr and "hello_dirty.py" in (
        refused.stderr
    )
    assert not Path(env["CLUSTERTRAIN_RUNS_DIR"]).exists()
    _, _, said = _submit(tree, env, *args, "--allow-dirty")
    sent = re.search(r"code: sent in login:~/(\S+)", said)[1]  # type: ignore[index]
    assert (REMOTE_HOME / sent / "hello_dirty.py").is_file()
    assert not (REMOTE_HOME / sent / "secret.env").exists()  # ignored files never leave
    followed = run_cli("logs", "last", "--follow", cwd=tree, env=env, timeout=300)
    assert followed.returncode == 0, followed.stdout[-2000:] + followed.stderr
    assert "dirty hello from node" in followed.stdout


def test_the_login_nodes_refusal_is_one_line_here(tree: Path, env: dict[str, str]) -> None:
    """Preflight runs there, against the real cluster's limits; its refusal is said here once."""
    done = run_cli(
        "submit", "--host", HOST, "--script", "train.py", "--cpus-per-task", "64", cwd=tree,
        env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("clustertrain: error: cpus_per_task: 64 CPUs per node")
    assert done.stderr.rstrip().endswith(f"(on {HOST})") and len(done.stderr.splitlines()) == 1
    assert "error" not in done.stdout and not Path(env["CLUSTERTRAIN_RUNS_DIR"]).exists()


def test_doctor_asks_the_login_node(tree: Path) -> None:
    done = run_cli("doctor", "--host", HOST, cwd=tree, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    version = run_cli("--version").stdout.split()[-1]
    assert f"ssh {HOST}: reached; clustertrain there: {version}, here: {version}" in done.stdout
    assert "partition" in done.stdout and "submission host: ready" in done.stdout
    missing = run_cli("doctor", "--host", HOST, "--remote-clustertrain", "/nowhere/ct", timeout=60)
    assert missing.returncode == 2 and missing.stderr.startswith(
        f"clustertrain: error: host: {HOST} has no `/nowhere/ct`"
    ), missing.stderr


def test_your_hosts_file_names_the_clustertrain_there(tree: Path, tmp_path: Path) -> None:
    """The file's entry for the host is the one ssh runs, unless a flag names another."""
    named = tmp_path / "hosts.yaml"
    named.write_text(f"{HOST}:\n  remote_clustertrain: /nowhere/ct\n")
    env = {"CLUSTERTRAIN_HOSTS_FILE": str(named)}
    from_file = run_cli("doctor", "--host", HOST, cwd=tree, env=env, timeout=60)
    assert from_file.returncode == 2 and from_file.stderr.startswith(
        f"clustertrain: error: host: {HOST} has no `/nowhere/ct`"
    ), from_file.stderr
    flag = run_cli(
        "doctor", "--host", HOST, "--remote-clustertrain", "clustertrain", cwd=tree, env=env,
        timeout=120,
    )  # fmt: skip
    assert flag.returncode == 0 and "submission host: ready" in flag.stdout, flag.stderr


@pytest.mark.every_slurm
def test_status_and_cancel_from_here(tree: Path, env: dict[str, str], data_dir: Path) -> None:
    job_id, _, _ = _submit(tree, env, *_mnist(data_dir, "--recipe", "fast", "--epochs", "50"))
    deadline = time.monotonic() + 120
    while "RUNNING" not in (status := run_cli("status", "last", cwd=tree, env=env).stdout):
        assert time.monotonic() < deadline, status
        time.sleep(1)
    cancelled = run_cli("cancel", "last", cwd=tree, env=env)
    assert cancelled.returncode == 0 and f"cancelled job {job_id}" in cancelled.stdout
    followed = run_cli("logs", "last", "--follow", cwd=tree, env=env, timeout=120)
    assert followed.returncode == 1 and "ended CANCELLED" in followed.stderr


API_SCRIPT = """
import json, sys
import clustertrain

data = sys.argv[1]
job = clustertrain.submit(
    "jobs/mnist.yaml", host="login", nodes=2, gpus_per_node=1,
    prepare=["python", "-m", "jobs.mnist.data", "--data-dir", data],
    extra_args=["--data-dir", data, *sys.argv[2:]],
)
followed = list(job.logs(follow=True))
again = clustertrain.Job.attach("last")
print(json.dumps({
    "job_id": job.job_id, "state": job.state, "followed": followed,
    "metrics": job.metrics(), "attached": [again.job_id, again.state, again.backend.name],
}))
"""


def test_the_python_api_submits_over_ssh_and_follows_from_here(
    tree: Path, env: dict[str, str], data_dir: Path
) -> None:
    """A script of the user's, with ``host=``: the same command line as the CLI's reaches the
    login node, and the Job answers its state, lines and metrics from there."""
    done = subprocess.run(
        [sys.executable, "-P", "-c", API_SCRIPT, str(data_dir), *SMOKE], cwd=tree,
        env={**os.environ, **env}, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["state"] == "COMPLETED" and said["attached"] == [said["job_id"], "COMPLETED", "ssh"]
    assert any("epoch 1/1: train_loss" in line for line in said["followed"]), said["followed"][-5:]
    assert [r["epoch"] for r in said["metrics"]] == [1] and said["metrics"][-1]["world_size"] == 2
    status = run_cli("status", "last", "--json", cwd=tree, env=env)
    assert status.returncode == 0, status.stderr
    assert {k: json.loads(status.stdout)[k] for k in ("job_id", "state")} == {
        "job_id": said["job_id"],
        "state": "COMPLETED",
    }


NOTEBOOK_SCRIPT = """
import json, sys
import clustertrain

def world(scale):  # defined in __main__, as a notebook cell defines it: sent by value
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    mine = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(mine)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} on {os.uname().nodename}")
    return {"world": dist.get_world_size(), "sum": mine.item() * scale}

print(json.dumps(clustertrain.notebook_launcher(
    world, (10,), host="login", nodes=2, procs_per_node=2, launcher="torchrun", cpus_per_task=1,
)))
"""


def test_a_notebooks_function_runs_through_the_login_node_and_its_value_comes_back(
    tree: Path, env: dict[str, str]
) -> None:
    """``notebook_launcher(..., host=)``: the call reaches the login node on ssh's stdin, is
    queued there in the code snapshot, every rank's lines stream here, and rank 0's sealed
    value comes back from the run folder there."""
    done = subprocess.run(
        [sys.executable, "-P", "-c", NOTEBOOK_SCRIPT], cwd=tree, env={**os.environ, **env},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"world": 4, "sum": 100.0}
    for rank in range(4):
        assert f"rank {rank} of 4 on node" in done.stdout, done.stdout[-3000:]
    assert "clustertrain: job " in done.stdout and "ended COMPLETED" in done.stdout
