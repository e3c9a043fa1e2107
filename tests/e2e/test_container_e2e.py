"""A 2-node x 1-process DDP job in an OCI container on the real local cluster: Slurm's own
``srun --container`` (oci.conf) runs each node's launcher in runc, the batch shell stays on the
host, and a user's USR2 still checkpoints every rank and requeues the job, which resumes.

Two images. The host's own root filesystem, mounted read-only (with the project's venv as the
container's PATH), runs in every CI run: it costs no build. Debian 12's own torch 1.13, built by
``scripts/build-oci-image`` with mmdebstrap from this machine's apt sources (about 1 minute, 1.4
GB, cached between runs), runs when that image is cached or ``CLUSTERTRAIN_IMAGE_TESTS=1`` asks
for the build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from clustertrain.localcluster import layout
from clustertrain.localcluster.layout import default_state_dir
from tests.conftest import ROOT, run_cli
from tests.e2e.test_preemption import _attempt_log, _slurm, _wait, release_requeued
from tests.e2e.test_slurm_e2e import cluster, submit  # noqa: F401  (cluster is a fixture)

pytestmark = pytest.mark.slurm
STEPS = 24
NODES = ["--nodes", "2", "--procs-per-node", "1", "--cpus-per-task", "1"]
IMAGE_CACHE = Path("/var/cache/clustertrain/images")
CHECK = re.compile(
    r"container check: rank (\d) of 2 host (\S+) torch (\S+) python (\S+) root read-only (\w+) "
    r"mnt (\S+) ifname (\S+) image (\S+) resumed at (\d+)"
)


def _slurmd_mount_namespaces() -> set[str]:
    record = json.loads(layout.record_path(default_state_dir()).read_text())
    return {
        os.readlink(f"/proc/{p['pid']}/ns/mnt")
        for p in record["processes"]
        if p["name"].startswith("slurmd")
    }


def _preempted_job(
    env: dict[str, str], image: str, *flags: str
) -> tuple[list[tuple[str, ...]], str]:
    """Submit tests/jobs/in_container.py in ``image``, send USR2 after step 8, release the
    requeued job and follow it to the end; return each attempt's container checks and what
    `logs --follow` printed."""
    job_id, run_dir = submit(
        env,
        *NODES,
        "--container-runtime",
        "oci",
        "--container-image",
        image,
        *flags,
        "--script",
        "tests/jobs/in_container.py",
        "--",
        str(STEPS),
    )
    assert (run_dir / "container" / "config.json").is_file()
    _wait("step 8", lambda: "step 8/" in _attempt_log(run_dir, 0))
    _slurm("scancel", "--signal=USR2", job_id)
    release_requeued(job_id, 1)
    done = run_cli("logs", job_id, "--follow", env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first, second = _attempt_log(run_dir, 0), _attempt_log(run_dir, 1)
    stopped = re.findall(r"stopping on SIGUSR2 after step (\d+): checkpoint written", first)
    assert len(stopped) == 2 and len(set(stopped)) == 1, first[-3000:]  # both ranks, one step
    assert f"step {STEPS}/{STEPS} loss" in second, second[-3000:]
    checks = [CHECK.findall(text) for text in (first, second)]
    assert [sorted(c[0] for c in attempt) for attempt in checks] == [["0", "1"], ["0", "1"]]
    assert {c[-1] for c in checks[0]} == {"0"} and {c[-1] for c in checks[1]} == set(stopped)
    # The batch shell ran on the host: its node check and requeue, and Slurm's record of both.
    status = run_cli("status", job_id, env=env)
    assert "COMPLETED" in status.stdout and "restarts: 1" in status.stdout, status.stdout
    return [c for attempt in checks for c in attempt], done.stdout


def _assert_in_the_container(checks: list[tuple[str, ...]]) -> None:
    host_namespaces = _slurmd_mount_namespaces() | {os.readlink("/proc/self/ns/mnt")}
    for _, host, _, _, read_only, mnt, ifname, _, _ in checks:
        assert host in ("node1", "node2")  # the node's own hostname: no UTS namespace
        assert read_only == "True" and mnt not in host_namespaces
        assert ifname == "eth0"  # the interface the node check found on the host
    assert not os.statvfs("/").f_flag & os.ST_RDONLY  # the host's root is writable


@pytest.mark.every_slurm
def test_an_oci_job_runs_in_runc_and_survives_a_preemption(
    cluster: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    venv = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv"))
    checks, followed = _preempted_job(env, "/", "--container-env", f"PATH={venv}/bin:/usr/bin:/bin")
    _assert_in_the_container(checks)
    assert re.search(r"^node[12] rank[01] \| container check: ", followed, re.MULTILINE)
    assert {c[7] for c in checks} == {"none"}


@pytest.fixture(scope="session")
def debian_torch_image() -> Path:
    cached = list(IMAGE_CACHE.glob("debian-bookworm-torch-*/rootfs/etc/clustertrain-image"))
    if not cached and not os.environ.get("CLUSTERTRAIN_IMAGE_TESTS"):
        pytest.skip("no cached Debian torch image; CLUSTERTRAIN_IMAGE_TESTS=1 builds it (~1 min)")
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-oci-image"), str(IMAGE_CACHE)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip())


def test_debian_torch_in_its_own_image_survives_a_preemption(
    cluster: None,  # noqa: F811
    tmp_path: Path,
    debian_torch_image: Path,
) -> None:
    image = debian_torch_image
    # A read-only image gets no new folders: the working directory needs its mount point
    # (under /tmp, as in CI, runc makes it in a tmpfs).
    if not ROOT.is_relative_to("/tmp"):
        (image / ROOT.relative_to("/")).mkdir(parents=True, exist_ok=True)
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    checks, followed = _preempted_job(env, str(image))
    _assert_in_the_container(checks)
    # torch 1.13 prefixes "[default0]:", the local rank; `logs` says so instead of "launcher".
    assert re.search(r"^node[12] local0 \| container check: ", followed, re.MULTILINE), followed
    marker = (image / "etc" / "clustertrain-image").read_text().strip()
    assert {(c[2], c[3], c[7]) for c in checks} == {("1.13.0a0", "/usr/bin/python3.11", marker)}
