"""Rendered scripts: golden files, bash -n, shellcheck, and the launcher command lines.

Regenerate the golden files after an intended change of the templates with:
    CLUSTERTRAIN_UPDATE_GOLDEN=1 python -m pytest tests/render/test_render.py
and review the diff (`git diff tests/golden`) before committing it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from clustertrain.errors import UserError
from clustertrain.render import Expand, RenderedJob, render
from tests.conftest import job_spec

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
RUN_DIR, WORKDIR = "/shared/runs/mnist-golden", "/shared/project"

CASES = {
    "1x1": {"nodes": 1},
    "1x8": {"nodes": 1, "gpus_per_node": 8},
    "4x8": {
        "nodes": 4,
        "gpus_per_node": 8,
        "partition": "gpu",
        "account": "proj-1",
        "exclusive": True,
        "sbatch_options": ["--reservation=maint"],
        "env": {"NCCL_DEBUG": "INFO"},
        "args": ["--epochs", "3"],
    },
    "4x8-gres": {"nodes": 4, "gpus_per_node": 8, "gpus_as_gres": True},
    "accelerate-2x4": {
        "nodes": 2,
        "gpus_per_node": 4,
        "launcher": "accelerate",
        "args": ["--strategy", "accelerate"],
        "venv": "/opt/venvs/train",
    },
    "pyxis-2x8": {
        "nodes": 2,
        "gpus_per_node": 8,
        "container_runtime": "pyxis",
        "container_image": "nvcr.io#nvidia/pytorch:24.01-py3",
        "container_mounts": ["/datasets/imagenet:/data:ro", "/scratch"],
        "container_env": {"NCCL_DEBUG": "INFO"},
        "setup": ["module load pyxis"],  # on the host
        "node_setup": ["ulimit -n 65536"],  # in the container
    },
    "apptainer-2x4": {
        "nodes": 2,
        "gpus_per_node": 4,
        "container_runtime": "apptainer",
        "container_image": "/images/pytorch.sif",
        "container_mounts": ["/datasets:/data:ro"],
    },
    "oci-2x1": {
        "nodes": 2,
        "container_runtime": "oci",
        "container_image": "/images/debian-torch/rootfs",
        "container_mounts": ["/datasets:/data:ro"],
        "container_env": {"PATH": "/opt/conda/bin:/usr/bin:/bin"},
    },
    "mnist-job-file": {  # what jobs/mnist.yaml adds: a prepare step and offline switches
        "nodes": 2,
        "gpus_per_node": 2,
        "prepare": [["python", "-m", "jobs.mnist.data"]],
        "offline": True,
        "env": {"WANDB_MODE": "disabled"},
    },
    "spares-2x8": {  # two spare nodes, so qualified (the default); no spare left: requeue
        "nodes": 2,
        "gpus_per_node": 8,
        "spare_nodes": 2,
        "requeue_on_node_failure": True,
    },
    "qualify-2x8": {  # every node qualified, spare too; nodes excluded; stragglers replaced
        "nodes": 2,
        "gpus_per_node": 8,
        "spare_nodes": 1,
        "qualify": True,
        "compute_threshold": 2.5,
        "on_flagged": "warn",
        "exclude": ["node7", "gpu-a.12"],
        "straggler_action": "replace",
    },
    "site-2x4": {  # what a site's defaults add: setup lines, resources per GPU
        "nodes": 2,
        "gpus_per_node": 4,
        "cpus_per_gpu": 6,
        "mem_per_gpu": "40G",
        "setup": [
            "module load cuda/12.1 nccl",
            "source /shared/venvs/train/bin/activate",
            'export NCCL_IB_HCA=mlx5 && echo "it\'s $NCCL_IB_HCA" # not a comment here; }',
        ],
        "node_setup": ["ulimit -n 65536", "mkdir -p /tmp/$USER/data\t# stage"],
    },
    "sweep-2x1": {
        "nodes": 2,
        "sweep": {"lr": ["0.1", "0.2"], "seed": ["1", "2"], "note": ["it's"]},
        "max_parallel": 2,
        "args": ["--epochs", "3"],
    },
}


def render_case(case: str) -> RenderedJob:
    return render(job_spec(**CASES[case]), RUN_DIR, WORKDIR)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_golden_file(case: str) -> None:
    text = render_case(case).dry_run_text()
    golden = GOLDEN / f"{case}.txt"
    if os.environ.get("CLUSTERTRAIN_UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), f"regenerate: see {__file__}'s docstring"


def test_every_golden_file_has_a_case() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_scripts_pass_bash_n_and_shellcheck(case: str, tmp_path: Path) -> None:
    job = render_case(case)
    for name, text in (("job.sbatch", job.batch_script), ("launch.sh", job.launch_script)):
        path = tmp_path / name
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)
        if shutil.which("shellcheck") is None:
            pytest.fail("shellcheck is not installed (apt-get install shellcheck)")
        checked = subprocess.run(
            ["shellcheck", "--shell=bash", str(path)], capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout


def test_directives_are_sorted_and_quoted_for_sbatch() -> None:
    """Double quotes: sbatch reads a backslash inside single quotes as an escape."""
    job = render(job_spec(nodes=2, name="it's my job", constraint="a100&ib"), RUN_DIR, WORKDIR)
    names = [d.split("=")[0] for d in job.directives if d.startswith("--")]
    assert names == sorted(names)
    assert '--job-name="it\'s my job"' in job.directives
    assert '--constraint="a100&ib"' in job.directives
    assert "--nodes=2" in job.directives


def test_torchrun_line_has_the_c10d_rendezvous_on_the_head_node() -> None:
    argv = render_case("4x8").launch_argv
    assert argv[:4] == ("torchrun", "--nnodes=4", "--nproc_per_node=8", "--rdzv_backend=c10d")
    assert "--rdzv_endpoint=$HEAD_NODE:$RDZV_PORT" in argv
    assert "--rdzv_id=$SLURM_JOB_ID" in argv
    assert argv[-4:] == ("-m", "jobs.mnist.train", "--epochs", "3")


def test_a_script_replaces_the_default_module_and_the_last_layer_wins() -> None:
    script = job_spec(script="train.py", args=["--epochs", "3"])
    assert script.module is None and render(script, RUN_DIR, WORKDIR).launch_argv[-3:] == (
        "train.py",
        "--epochs",
        "3",
    )
    # A flag's module replaces the job file's script, and the other way round.
    assert job_spec({"script": "train.py"}, module="pkg.train").entrypoint == ("-m", "pkg.train")
    assert job_spec({"module": "pkg.train"}, script="x.py").entrypoint == ("x.py",)


def test_accelerate_takes_the_machine_rank_on_each_node_at_run_time() -> None:
    job = render(job_spec(nodes=4, gpus_per_node=8, launcher="accelerate"), RUN_DIR, WORKDIR)
    argv = job.launch_argv
    assert argv[argv.index("--machine_rank") + 1] == "$SLURM_NODEID"
    assert argv[argv.index("--num_processes") + 1] == "32"
    assert argv[argv.index("--num_machines") + 1] == "4"
    assert '--machine_rank "$SLURM_NODEID"' in job.launch_script
    assert "$SLURM_NODEID" not in job.batch_script


def test_srun_starts_one_launcher_per_node_and_kills_on_bad_exit() -> None:
    srun = json.loads(render_case("4x8").plan)["step"]  # what the supervisor runs
    assert srun[0] == "srun" and "--kill-on-bad-exit=1" in srun and "--ntasks-per-node=1" in srun
    assert srun[-2:] == ["bash", f"{RUN_DIR}/launch.sh"]


def test_expand_refuses_anything_but_variable_references() -> None:
    for unsafe in ("$(id)", "`id`", 'a"b', "a\\b", "$((1+1))", "x\ny"):
        with pytest.raises(ValueError):
            Expand(unsafe)


def test_render_refuses_paths_slurm_cannot_take() -> None:
    for bad in ("runs/x", "/runs/%j", "/runs/a\nb", '/runs/a"b', "/runs/a\\b"):
        with pytest.raises(UserError, match="runs dir"):
            render(job_spec(), bad, WORKDIR)
        with pytest.raises(UserError, match="working directory"):
            render(job_spec(), RUN_DIR, bad)


def test_a_lost_node_requeues_the_job_only_when_asked() -> None:
    default = render(job_spec(nodes=2), RUN_DIR, WORKDIR)
    assert "--no-requeue" in default.directives and "--requeue" not in default.directives
    # Its own checkpoint requeue makes the job requeueable first, and a later attempt not again:
    # the supervisor's part (tests/node/test_supervisor.py), told by the plan.
    assert json.loads(default.plan)["requeue_on_node_failure"] is False
    asked = render(job_spec(nodes=2, requeue_on_node_failure=True), RUN_DIR, WORKDIR)
    assert "--requeue" in asked.directives and "--no-requeue" not in asked.directives
    assert json.loads(asked.plan)["requeue_on_node_failure"] is True


def test_spares_without_qualification_check_only_the_steps_nodes() -> None:
    """``spare_nodes`` with ``qualify: false``: spares-2x8's job as it rendered before spares
    turned qualification on (the golden file shows it on)."""
    off = json.loads(render(job_spec(**CASES["spares-2x8"], qualify=False), RUN_DIR, WORKDIR).plan)
    assert "qualify" not in off and "--qualify" not in off["node_check"]
    assert "--nodelist=$CLUSTERTRAIN_NODES" in str(off["node_check"])  # the step's, no spare
    on = json.loads(render_case("spares-2x8").plan)
    assert on["qualify"] is True and on["node_check"][-1] == "--qualify"
