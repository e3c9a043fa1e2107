"""Ordinary users, for real: root brought the local cluster up (as an admin does); two new
unprivileged users, each with a home of their own and a virtual environment made from Debian's
own Python (root's pyenv is inside /root, mode 700: no user could run it), install the wheel of
this checkout and use clustertrain as a site's users do.

User A submits the headline MNIST job from an empty folder of their home, follows it to
COMPLETED, reads its status and draws its plot; the job ran as A on the nodes, and A's run folder
is A's alone (0700). User B can neither read A's run (`status`, `logs`: one line, exit 2), nor
cancel A's job (clustertrain refuses with one line; Slurm's own scancel is refused too)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import build_wheel
from tests.e2e.test_slurm_e2e import cluster  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PYTHON = "/usr/bin/python3"  # Debian's, as at a site


@dataclass(frozen=True)
class User:
    name: str
    home: Path

    def run(
        self, *argv: str, timeout: float = 300, cwd: Path | None = None, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = [f"HOME={self.home}", f"PATH={self.home}/venv/bin:/usr/bin:/bin",
               f"SLURM_CONF={os.environ['SLURM_CONF']}", f"USER={self.name}",
               f"CLUSTERTRAIN_DATA_DIR={self.home}/mnist"]  # fmt: skip
        return subprocess.run(
            ["runuser", "-u", self.name, "--", "env", "-i", *env, *argv],
            cwd=cwd or self.home, capture_output=True, text=True, timeout=timeout, check=False,
            input=stdin,
        )  # fmt: skip


def _end_processes(uid: int) -> None:
    """Every process of ``uid``, by PID (never by name)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if proc.stat().st_uid == uid:
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue


@pytest.fixture(scope="module")
def users(cluster: None, data_dir: Path) -> Iterator[tuple[User, User]]:  # noqa: F811
    tag = os.getpid() % 100000
    made: list[User] = []
    shared = Path(tempfile.mkdtemp(prefix="clustertrain-wheel-"))
    try:
        shared.chmod(0o755)
        wheel = build_wheel(shared)
        for path in (wheel.parent, wheel):
            path.chmod(0o755 if path.is_dir() else 0o644)
        for letter in "ab":
            name = f"ctuser{letter}{tag}"
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
            # No password, and not a locked account either: sshd lets such a user in by key.
            subprocess.run(["usermod", "-p", "*", name], check=True)
            made.append(User(name, Path(pwd.getpwnam(name).pw_dir)))
        a = made[0]
        assert a.run(PYTHON, "-m", "venv", f"{a.home}/venv").returncode == 0
        pip = a.run(f"{a.home}/venv/bin/pip", "install", "-q", "torch==2.14.1",
                    "torchvision==0.29.1", f"{wheel}[train,plot]", timeout=900)  # fmt: skip
        assert pip.returncode == 0, pip.stderr[-2000:]
        # The data A's job reads, as a prepare step of A's would have fetched it.
        shutil.copytree(data_dir, a.home / "mnist")
        subprocess.run(["chown", "-R", f"{a.name}:{a.name}", str(a.home / "mnist")], check=True)
        b = made[1]  # B runs A's clustertrain (the same install a site gives everyone)
        yield a, b
    finally:
        for user in made:
            _end_processes(pwd.getpwnam(user.name).pw_uid)
            subprocess.run(["userdel", "-r", user.name], capture_output=True, check=False)
        shutil.rmtree(shared, ignore_errors=True)


def test_a_user_runs_the_headline_job_and_another_cannot_read_or_cancel_it(
    users: tuple[User, User],
) -> None:
    a, b = users
    work = a.home / "project"
    assert a.run("mkdir", str(work)).returncode == 0
    submitted = a.run("clustertrain", "submit", "--nodes", "2", "--gpus-per-node", "1",
                      "--", "--epochs", "1", cwd=work)  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = re.search(r"submitted job (\d+)", submitted.stdout)[1]  # type: ignore[index]
    run_dir = Path(re.search(r"run folder: (.+)", submitted.stdout)[1])  # type: ignore[index]

    # B, beside A: A's run folder is closed to B, and so is A's job.
    folder = run_dir.stat()
    assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == pwd.getpwnam(a.name).pw_uid
    b_clustertrain = str(a.home / "venv" / "bin" / "clustertrain")
    a.home.chmod(0o755)  # Debian's default home: B may run A's install, not read A's runs
    runs_dir = ["--runs-dir", str(run_dir.parent)]
    for command in (["status", str(run_dir)], ["logs", str(run_dir)], ["cancel", str(run_dir)],
                    ["status", job_id, *runs_dir], ["cancel", job_id, *runs_dir],
                    ["plot", run_dir.name, *runs_dir]):  # fmt: skip
        said = b.run(b_clustertrain, *command)
        assert said.returncode == 2, (command, said.stdout, said.stderr)
        assert said.stderr.startswith("clustertrain: error: ") and said.stderr.count("\n") == 1
    refused = b.run("scancel", job_id)
    assert "denied" in (refused.stderr + refused.stdout).lower() or refused.returncode != 0

    followed = a.run("clustertrain", "logs", job_id, "--follow", cwd=work, timeout=600)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-2000:]
    assert "ended COMPLETED" in followed.stderr
    status = a.run("clustertrain", "status", job_id, cwd=work)
    assert "COMPLETED" in status.stdout and "final test_acc" in status.stdout, status.stdout
    plot = a.run("clustertrain", "plot", job_id, cwd=work)
    assert plot.returncode == 0, plot.stderr
    # The job ran as A on the nodes: every file it wrote is A's.
    owners = {p.stat().st_uid for p in run_dir.rglob("*")}
    assert owners == {pwd.getpwnam(a.name).pw_uid}


TRAIN = """import os, sys
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} as {os.environ['USER']}",
      *sys.argv[1:])
"""

API = """import json, clustertrain
job = clustertrain.submit(nodes=2, gpus_per_node=0, cpus_per_task=1,
                          extra_args=["--epochs", "1", "--limit-train", "2000"])
state = job.wait(timeout=600)
print(json.dumps({"state": state, "done": job.metrics()[-1]}))
"""

NOTEBOOK = """import json, clustertrain

def world(scale):  # defined in __main__, as a notebook cell defines it
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    mine = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(mine)
    return {"world": dist.get_world_size(), "sum": mine.item() * scale}

print(json.dumps(clustertrain.notebook_launcher(
    world, (10,), host="login", nodes=2, procs_per_node=1, launcher="torchrun", cpus_per_task=1,
)))
"""


def _ssh_to_login(user: User) -> None:
    """``ssh login`` for ``user`` as at a site: a key of their own in their authorized_keys,
    the login node's host key pinned, and their clustertrain there named in their hosts file."""
    from clustertrain import localcluster as local

    state = local.default_state_dir()
    layout = local.current_layout(state)
    assert layout is not None and layout.network == "namespaces"
    host_key = " ".join((state / "ssh" / "host_ed25519.pub").read_text().split()[:2])
    ssh = user.home / ".ssh"
    made = user.run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{ssh}/id_ed25519")
    assert made.returncode == 0, made.stderr
    files = {
        "authorized_keys": (ssh / "id_ed25519.pub").read_text(),
        "known_hosts": f"login {host_key}\n",
        "config": f"Host login\n    HostName {layout.login_address}\n    User {user.name}\n"
        "    HostKeyAlias login\n    StrictHostKeyChecking yes\n",
    }
    for name, text in files.items():
        assert user.run("sh", "-c", f"umask 077 && cat > {ssh / name}", stdin=text).returncode == 0
    hosts = f"login:\n  remote_clustertrain: {user.home}/venv/bin/clustertrain\n"
    config = user.home / ".config" / "clustertrain"
    assert user.run("mkdir", "-p", str(config)).returncode == 0
    assert user.run("sh", "-c", f"cat > {config}/hosts.yaml", stdin=hosts).returncode == 0


def test_a_users_sweep_api_script_and_login_node_submissions_run_as_that_user(
    users: tuple[User, User],
) -> None:
    """What else a user does, as that user: a sweep, the Python API, ``submit --host login``
    (their own key, their own clustertrain there) and a notebook's function through the login
    node; every job's files are theirs, and their run folders theirs alone."""
    a, _ = users
    uid = pwd.getpwnam(a.name).pw_uid
    tree = a.home / "laptop"
    for step in (["mkdir", str(tree)], ["git", "init", "-q", str(tree)]):
        assert a.run(*step).returncode == 0
    for name, text in {"train.py": TRAIN, "api.py": API, "nb.py": NOTEBOOK,
                       ".gitignore": "runs/\n"}.items():  # fmt: skip
        assert a.run("sh", "-c", f"cat > {tree / name}", stdin=text).returncode == 0
    commit = a.run("sh", "-c", "git add -A && git -c user.name=a -c user.email=a@a commit -qm c",
                   cwd=tree)  # fmt: skip
    assert commit.returncode == 0, commit.stderr

    sweep = a.run("clustertrain", "submit", "--nodes", "1", "--gpus-per-node", "0",
                  "--cpus-per-task", "1", "--sweep", "lr=0.05,0.1", "--", "--epochs", "1",
                  "--limit-train", "2000", cwd=tree)  # fmt: skip
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    followed = a.run("clustertrain", "logs", "last", "--follow", cwd=tree, timeout=600)
    assert followed.returncode == 0, followed.stdout[-2000:] + followed.stderr[-2000:]
    results = a.run("clustertrain", "results", "last", "--json", cwd=tree)
    assert sorted(row["params"]["lr"] for row in json.loads(results.stdout)) == ["0.05", "0.1"]

    api = a.run("python", "api.py", cwd=tree, timeout=600)
    assert api.returncode == 0, api.stdout[-2000:] + api.stderr[-2000:]
    said = json.loads(api.stdout.splitlines()[-1])
    assert said["state"] == "COMPLETED" and said["done"]["world_size"] == 2, said

    _ssh_to_login(a)
    far = a.run("clustertrain", "submit", "--host", "login", "--script", "train.py",
                "--nodes", "2", "--gpus-per-node", "0", "--cpus-per-task", "1", "--", "hello",
                cwd=tree)  # fmt: skip
    assert far.returncode == 0, far.stdout + far.stderr
    followed = a.run("clustertrain", "logs", "last", "--follow", cwd=tree, timeout=600)
    assert followed.returncode == 0, followed.stdout[-2000:] + followed.stderr[-2000:]
    assert f"rank 1 of 2 as {a.name} hello" in followed.stdout, followed.stdout[-2000:]

    notebook = a.run("python", "nb.py", cwd=tree, timeout=600)
    assert notebook.returncode == 0, notebook.stdout[-3000:] + notebook.stderr[-2000:]
    assert json.loads(notebook.stdout.splitlines()[-1]) == {"world": 2, "sum": 30.0}

    # Every run folder, here and on the login node, is A's alone, and all in it is A's.
    folders = [*(tree / "runs").iterdir(), *(a.home / ".clustertrain" / "runs").iterdir()]
    assert len(folders) == 6, folders  # sweep, api, submit --host and notebook (twice each)
    for folder in folders:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
        assert {p.stat().st_uid for p in folder.rglob("*")} == {uid}, folder
