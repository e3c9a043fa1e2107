"""The command line as users run it: a subprocess, its stdout, stderr and exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

COMMANDS = [
    "submit",
    "status",
    "list",
    "cancel",
    "logs",
    "track",
    "cluster",
    "cluster up",
    "cluster down",
    "cluster status",
]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_help_shows_an_example(command: str) -> None:
    done = run_cli(*command.split(), "--help")
    assert done.returncode == 0, done.stderr
    assert "clustertrain " in done.stdout.split("Example")[-1]


def test_version() -> None:
    from clustertrain import __version__

    assert run_cli("--version").stdout.strip() == f"clustertrain, version {__version__}"


def test_dry_run_prints_both_scripts_and_writes_nothing(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    done = run_cli(
        "submit", "--nodes", "4", "--gpus-per-node", "8", "--dry-run", cwd=tmp_path, env=cli_env
    )
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --nodes=4" in done.stdout and "--nproc_per_node=8" in done.stdout
    assert done.stdout.count("#!/bin/bash") == 2
    assert list(tmp_path.iterdir()) == []


def test_dry_run_needs_neither_slurm_nor_torch_nor_submitit(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from clustertrain.cli import main\n"
        "try:\n"
        "    main(['submit', '--nodes', '4', '--gpus-per-node', '8', '--dry-run'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = {'torch', 'submitit', 'accelerate', 'torchvision'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent", "HOME": str(tmp_path)},
    )
    assert done.stderr.strip() == "[]"
    assert "#SBATCH --nodes=4" in done.stdout


def test_job_file_with_flag_overrides_and_trailing_args(cli_env: dict[str, str]) -> None:
    done = run_cli(
        "submit",
        "jobs/mnist.yaml",
        "--nodes",
        "3",
        "--dry-run",
        "--",
        "--epochs",
        "5",
        "it's $(here)",
        env=cli_env,
    )
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --nodes=3" in done.stdout and "--nnodes=3" in done.stdout
    # After the job file's own args: the script's parser sees --epochs 5 last, and it wins.
    assert (
        "    --recipe fast \\\n    --epochs 2 \\\n    --epochs 5 \\\n    'it'\"'\"'s $(here)'\n"
        in done.stdout
    ), done.stdout


def test_replace_args_drops_the_job_files_args(cli_env: dict[str, str]) -> None:
    done = run_cli(
        "submit", "jobs/mnist.yaml", "--replace-args", "--dry-run", "--", "--epochs", "5",
        env=cli_env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "    --epochs 5\n" in done.stdout and "--recipe" not in done.stdout


def test_env_and_sbatch_options_merge_per_key(cli_env: dict[str, str], tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "env: {A: file, B: file}\nsbatch_options: ['--comment=file', '--reservation=file']\n"
        "venv: /opt/file-venv\nexclusive: true\nnode_check: true\n"
    )
    done = run_cli(
        "submit", str(job), "--env", "A=flag", "--sbatch-option", "--comment=flag",
        "--no-exclusive", "--no-node-check", "--module", "pkg.train", "--dry-run", env=cli_env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "export A=flag\nexport B=file\n" in out
    assert "#SBATCH --comment=flag\n#SBATCH --reservation=file\n" in out
    assert "--exclusive" not in out and "nodecheck" not in out
    # The job file's venv beats the one clustertrain itself runs in.
    assert "export VIRTUAL_ENV=/opt/file-venv\n" in out


def test_every_field_has_a_flag() -> None:
    from clustertrain.cli.commands import submit
    from clustertrain.spec import FIELDS

    flags = {p.name for p in submit.params} | {"args"}  # args: after --, or --replace-args
    assert set(FIELDS) <= flags
    booleans = [p for p in submit.params if p.name in ("exclusive", "gpus_as_gres", "node_check")]
    assert all(p.secondary_opts for p in booleans)  # each has its --no- form


def test_accelerate_job_file(cli_env: dict[str, str]) -> None:
    done = run_cli("submit", "jobs/mnist-accelerate.yaml", "--nodes", "4", "--dry-run", env=cli_env)
    assert "--num_processes 8" in done.stdout and '--machine_rank "$SLURM_NODEID"' in done.stdout


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--nodes", "0"], "nodes"),
        (["--gpus-per-node", "-1"], "gpus_per_node"),
        (["--time", "25:99"], "time"),
        (["--launcher", "mpirun"], "launcher"),
        (["--name", "a\nb"], "name"),
        (["--env", "no_equals"], "env"),
        (["--partition", "gpu;reboot"], "partition"),
        (["missing.yaml"], "job file"),
        (["--nodes", "two"], "nodes: invalid value 'two'; must be an integer"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(
    args: list[str], field: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    done = run_cli("submit", *args, cwd=tmp_path, env=cli_env)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "content",
    ["- a\n- b\n", "just text\n", "nodes: [1\n", "nodez: 2\n", "nodes: 0\n", "args: --epochs 3\n"],
)
def test_bad_job_files(content: str, tmp_path: Path, cli_env: dict[str, str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(content)
    done = run_cli("submit", str(job), "--dry-run", env=cli_env)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("clustertrain: error: ")


def test_unknown_job_is_exit_2(cli_env: dict[str, str]) -> None:
    for command in (
        ["status", "4242"],
        ["logs", "4242"],
        ["cancel", "4242"],
        ["status", "last"],
        ["logs", "../../etc"],
        ["stacks", "4242"],
        ["top", "4242", "--once"],
        ["attach", "../../etc"],
        ["attach", "-x"],
        ["track", "4242", "--to", "tensorboard"],
    ):
        done = run_cli(*command, env=cli_env)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, command


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).with_name("clustertrain")
    done = subprocess.run([str(exe), "--help"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and "submit" in done.stdout
