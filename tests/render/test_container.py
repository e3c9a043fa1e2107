"""Container jobs without a cluster: what each runtime renders, what runs where, what the launch
script does inside the image, and what preflight refuses. The real runc job is in
tests/e2e/test_container_e2e.py; the golden files of each runtime are in
tests/render/test_render.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from clustertrain.backends.slurm import Slurm, cluster_info, preflight
from clustertrain.errors import UserError
from clustertrain.render import RenderedJob, container, render
from tests.backends.test_slurm_parsing import FakeRunner
from tests.conftest import job_spec, run_cli
from tests.e2e.test_slurm_e2e import cluster  # noqa: F401  (a fixture)

RUN_DIR, WORKDIR = "/shared/runs/job-1", "/shared/project"


def _job(runtime: str, image: str = "/images/torch", run_dir: str = RUN_DIR, **fields: object):
    spec = job_spec(container_runtime=runtime, container_image=image, nodes=2, **fields)
    return render(spec, run_dir, WORKDIR)


def _srun_lines(job: RenderedJob) -> tuple[str, str]:
    """The node check's srun line and the launch step's, as the supervisor's plan holds them."""
    plan = json.loads(job.plan)
    check, launch = (" ".join(map(str, plan[key])) for key in ("node_check", "step"))
    assert "clustertrain.node.nodecheck probe" in check and "launch.sh" in launch
    return check, launch


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "oci"])
def test_only_the_launch_step_runs_in_the_container(runtime: str) -> None:
    """The supervisor (signals, requeue) and the node check stay on the host."""
    check, launch = _srun_lines(_job(runtime))
    assert "container" not in check and "apptainer" not in check
    assert ("apptainer exec" in launch) == (runtime == "apptainer")
    assert ("--container-image=/images/torch" in launch) == (runtime == "pyxis")
    assert (f"--container={RUN_DIR}/container" in launch) == (runtime == "oci")
    assert "\nexec python -m clustertrain.node.supervisor " in _job(runtime).batch_script


def test_apptainer_asks_for_the_gpus_only_on_gpu_jobs() -> None:
    assert "apptainer exec --nv --bind" in _srun_lines(_job("apptainer", gpus_per_node=4))[1]
    assert "--nv" not in _srun_lines(_job("apptainer"))[1]


def test_the_run_folder_and_working_directory_are_always_mounted_at_their_paths() -> None:
    spec = job_spec(
        container_runtime="pyxis",
        container_image="img",
        container_mounts=["/datasets:/data:ro", "/scratch", "/models:ro"],
    )
    mounts = [m.text() for m in container.mounts(spec, RUN_DIR, WORKDIR)]
    assert mounts == [
        f"{WORKDIR}:{WORKDIR}",
        f"{RUN_DIR}:{RUN_DIR}",
        "/datasets:/data:ro",
        "/scratch:/scratch",
        "/models:/models:ro",
    ]
    # A run folder inside the working directory comes with it: one mount, not two.
    inside = container.mounts(spec, f"{WORKDIR}/runs/job-1", WORKDIR)
    assert [m.source for m in inside][:2] == [WORKDIR, "/datasets"]
    launch = _srun_lines(_job("pyxis", container_mounts=["/datasets:/data:ro"]))[1]
    assert f"--container-mounts={WORKDIR}:{WORKDIR},{RUN_DIR}:{RUN_DIR},/datasets:/data:ro" in (
        launch
    )
    assert f"--container-workdir={WORKDIR}" in launch


def test_the_oci_bundle_mounts_the_image_read_only_and_shares_the_nodes_network() -> None:
    job = _job("oci", container_mounts=["/datasets:/data:ro"])
    assert job.container_config is not None
    config = json.loads(job.container_config)
    mounts = config["mounts"]
    assert mounts[0] == {
        "destination": "/",
        "type": "bind",
        "source": "/images/torch",
        "options": ["rbind", "ro"],
    }
    assert config["root"] == {"path": "rootfs", "readonly": True}
    # The node's network, hostname and processes: no namespaces but the mount namespace.
    assert config["linux"]["namespaces"] == [{"type": "mount"}]
    by_destination = {m["destination"]: m for m in mounts}
    assert by_destination["/etc/hosts"]["source"] == "/etc/hosts"
    assert by_destination["/etc/resolv.conf"]["source"] == "/etc/resolv.conf"
    assert by_destination["/dev/shm"]["type"] == "bind"  # not runc's 64 MB tmpfs
    assert by_destination["/tmp"]["type"] == "tmpfs"
    assert "rw" in by_destination[RUN_DIR]["options"] and WORKDIR in by_destination
    assert by_destination["/data"] == {
        "destination": "/data",
        "type": "bind",
        "source": "/datasets",
        "options": ["rbind", "ro"],
    }
    assert config["process"]["cwd"] == WORKDIR
    assert "config.json" in job.dry_run_text() and job.container_config in job.dry_run_text()
    assert _job("pyxis").container_config is None


def test_a_folder_with_a_separator_cannot_be_mounted_by_pyxis_or_apptainer() -> None:
    for runtime in ("pyxis", "apptainer"):
        with pytest.raises(UserError, match=f"runs dir: .* cannot be mounted by {runtime}"):
            _job(runtime, run_dir="/shared/runs,x/job-1")
    _job("oci", run_dir="/shared/runs,x/job-1")  # a JSON list has no separators


def _run_launch(job: RenderedJob, tmp_path: Path, **env: str) -> dict[str, str]:
    """Run the launch script as srun would inside the container, with a stub torchrun that
    prints its environment, and return what the stub saw."""
    image_bin, venv = tmp_path / "image-bin", tmp_path / "venv"
    for folder in (image_bin, venv / "bin"):
        folder.mkdir(parents=True)
        stub = folder / "torchrun"
        stub.write_text(f"#!/bin/sh\necho torchrun={stub}\nenv\n")
        stub.chmod(0o755)
    log_dir = tmp_path / "logs"
    (log_dir / "node-check").mkdir(parents=True)
    (log_dir / "node-check" / "node1.ifname").write_text("eth7")
    launch = tmp_path / "launch.sh"
    launch.write_text(job.launch_script)
    base = {
        "PATH": f"{venv}/bin:{image_bin}:/usr/bin:/bin",
        "VIRTUAL_ENV": str(venv),
        "LOG_DIR": str(log_dir),
        "SLURMD_NODENAME": "node1",
        "SLURM_NODEID": "0",
        "HEAD_NODE": "node1",
        "RDZV_PORT": "29500",
        "SLURM_JOB_ID": "1",
    }
    subprocess.run(["bash", str(launch)], env={**base, **env}, check=True, timeout=30)
    out = (log_dir / "node1.out").read_text().splitlines()
    seen = dict(line.split("=", 1) for line in out if "=" in line)
    return seen


def test_inside_the_container_the_image_python_runs_with_the_hosts_interface(
    tmp_path: Path,
) -> None:
    job = _job("oci", container_env={"NCCL_DEBUG": "INFO", "PATH_NOTE": "$(touch PWNED)"})
    seen = _run_launch(job, tmp_path)
    assert seen["torchrun"] == str(tmp_path / "image-bin" / "torchrun")  # not the venv's
    assert "VIRTUAL_ENV" not in seen and str(tmp_path / "venv") not in seen["PATH"]
    # The node check wrote it on the host: the image needs no clustertrain.
    assert seen["GLOO_SOCKET_IFNAME"] == seen["NCCL_SOCKET_IFNAME"] == "eth7"
    assert seen["NCCL_DEBUG"] == "INFO" and seen["PATH_NOTE"] == "$(touch PWNED)"
    assert not list(tmp_path.glob("PWNED")) and not Path("PWNED").exists()


def test_container_env_may_set_the_containers_path(tmp_path: Path) -> None:
    image_tools = tmp_path / "opt" / "conda" / "bin"
    image_tools.mkdir(parents=True)
    (image_tools / "torchrun").write_text("#!/bin/sh\necho torchrun=conda\n")
    (image_tools / "torchrun").chmod(0o755)
    job = _job("apptainer", container_env={"PATH": f"{image_tools}:/usr/bin:/bin"})
    assert _run_launch(job, tmp_path)["torchrun"] == "conda"


# ---------------------------------------------------------------------------------------------
# Preflight: a runtime the cluster lacks, an image or mount this host does not have.


def _info(runtimes: set[str]) -> cluster_info.ClusterInfo:
    part = cluster_info.Partition("debug", True, None, None, "UP")
    node = cluster_info.Node("n1", ("debug",), 8, 4096, 0, "idle")
    missing = (("pyxis", "srun --help has no --container-image: no pyxis plugin"),)
    return cluster_info.ClusterInfo(
        "slurm 22.05.8", (part,), (node,), None, frozenset(runtimes), missing
    )


def test_preflight_refuses_a_runtime_the_cluster_lacks() -> None:
    spec = job_spec(container_runtime="pyxis", container_image="nvcr.io#nvidia/pytorch:24.01")
    with pytest.raises(UserError) as refused:
        preflight.check(spec, _info({"oci"}))
    assert str(refused.value).startswith(
        "container_runtime: pyxis is not installed on this cluster (srun --help has no "
        "--container-image: no pyxis plugin); runtimes here: oci"
    )
    preflight.check(spec, _info({"pyxis", "oci"}))


def test_the_cluster_reports_which_runtimes_it_has(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    config = f"SLURM_CONF              = {conf}\nMaxArraySize = 1001\n"
    answers = {
        "scontrol show partition": (0, "PartitionName=debug Default=YES State=UP\n", ""),
        "sinfo --Node": (0, "n1|debug*|8|4096|(null)|idle\n", ""),
        "sinfo --version": (0, "slurm 22.05.8\n", ""),
        "scontrol show config": (0, config, ""),
        "srun --help": (0, "Usage: srun [OPTIONS...]\n      --container=PATH\n", ""),
    }
    info = Slurm(FakeRunner(answers)).cluster_info()
    assert "pyxis" not in info.container_runtimes and "oci" not in info.container_runtimes
    assert f"no {tmp_path / 'oci.conf'}" in dict(info.missing_runtimes)["oci"]
    (tmp_path / "oci.conf").write_text("RunTimeRun=...\n")
    answers["srun --help"] = (0, "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n", "")
    info = Slurm(FakeRunner(answers)).cluster_info()
    assert {"pyxis", "oci"} <= set(info.container_runtimes)
    assert ("apptainer" in info.container_runtimes) == any(
        Path(d, "apptainer").exists() for d in os.environ["PATH"].split(":")
    )


def test_an_oci_image_must_have_the_mount_points_the_job_needs(tmp_path: Path) -> None:
    image = tmp_path / "rootfs"
    with pytest.raises(UserError, match="is not a folder here"):
        preflight.check_files(_job("oci", str(image)))
    (image / "etc").mkdir(parents=True)
    job = _job("oci", str(image), container_mounts=[f"{tmp_path}:/data"])
    with pytest.raises(UserError) as refused:
        preflight.check_files(job)
    message = str(refused.value)
    assert f"lacks /etc/hosts, /etc/resolv.conf, {WORKDIR}, {RUN_DIR}, /data," in message
    fix = f"mkdir -p {image}{WORKDIR} {image}{RUN_DIR} {image}/data; touch {image}/etc/hosts"
    assert f"{fix} {image}/etc/resolv.conf" in message
    for path in ("etc/hosts", "etc/resolv.conf", WORKDIR[1:], RUN_DIR[1:], "data"):
        (image / path).parent.mkdir(parents=True, exist_ok=True)
        (image / path).touch() if path.startswith("etc/") else (image / path).mkdir()
    preflight.check_files(job)
    # Under /tmp, a fresh tmpfs in the container, runc creates what it needs.
    tmp_job = render(job.spec, "/tmp/runs/job-1", "/tmp/project")
    assert container.missing_mount_points(tmp_job.spec, "/tmp/r", "/tmp/p", str(image)) == []
    missing_source = _job("apptainer", container_mounts=[f"{tmp_path}/nowhere:/data"])
    with pytest.raises(UserError, match="container_mounts: .*nowhere does not exist here"):
        preflight.check_files(missing_source)


@pytest.mark.slurm
def test_submit_refuses_a_runtime_the_local_cluster_lacks(
    cluster: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    for runtime, why in (("pyxis", "srun --help has no --container-image"), ("apptainer", "PATH")):
        done = run_cli(
            "submit", "--container-runtime", runtime, "--container-image", "/i.sif", env=env
        )
        assert done.returncode == 2, done.stdout + done.stderr
        (line,) = done.stderr.splitlines()
        assert f"container_runtime: {runtime} is not installed on this cluster" in line, line
        assert why in line and "runtimes here: oci" in line
    assert not (tmp_path / "runs").exists()


def test_a_local_run_refuses_a_container(tmp_path: Path) -> None:
    done = run_cli(
        "run",
        "--container-runtime",
        "oci",
        "--container-image",
        "/images/rootfs",
        env={"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")},
    )
    assert done.returncode == 2 and "container_image: a local run uses" in done.stderr
    assert not (tmp_path / "runs").exists()
