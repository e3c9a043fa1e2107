"""The MNIST job run the way users run it: `python -m jobs.mnist.train`, under torchrun, under
srun-style variables, under accelerate launch, and from a notebook launcher. Small subsets keep
each run to seconds on a 2-core CPU; the test set is always the full 10,000 images."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ["-m", "jobs.mnist.train"]  # run as users run it, from the repository root
BIN = Path(sys.executable).parent
# Small, stable settings: 4,000 images, 2 epochs, the lean net.
SMALL = ["--recipe", "fast", "--limit-train", "4000", "--batch-size", "64", "--lr", "0.05"]
SMALL += ["--epochs", "2", "--log-every", "20"]
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_")


def _clean_env(**extra: str) -> dict[str, str]:
    """os.environ without launcher or Slurm variables, which would change the world size."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "ACCELERATE_", *LAUNCH_VARS))
    }
    return {**env, **extra}


def _free_port(low: int = 0, high: int = 0) -> int:
    """A port nobody listens on; within [low, high) when given."""
    for port in random.sample(range(low, high), 50) if high else [0]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError(f"no free port in [{low}, {high})")


def accelerate_2() -> list[str]:
    """`accelerate launch` of 2 real processes on this machine, on a free port."""
    return [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2"] + [
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()),
    ]  # fmt: skip


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ROOT, env=_clean_env(**env), capture_output=True, text=True, timeout=300
    )


def _train(data_dir: Path, out: Path, *args: str, launcher: list[str] | None = None) -> Any:
    proc = _run(
        [
            *(launcher or [sys.executable]),
            *TRAIN,
            *args,
            "--data-dir",
            str(data_dir),
            "--out-dir",
            str(out),
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _check_run(out: Path, strategy: str, world_size: int, epochs: int = 2) -> None:
    records = _metrics(out)
    *per_epoch, done = records
    assert [r["epoch"] for r in per_epoch] == list(range(1, epochs + 1))
    for record in per_epoch:
        assert record["world_size"] == world_size and record["strategy"] == strategy
        assert 0 <= record["test_acc"] <= 1 and record["images_per_s"] > 0
        assert {"train_loss", "test_loss", "epoch_s"} <= record.keys()
    assert per_epoch[-1]["test_acc"] > 0.85, per_epoch
    assert done["event"] == "done" and done["test_acc"] == per_epoch[-1]["test_acc"]
    assert done["time_to_target_s"] is None  # 99 % is out of reach on 4,000 images
    phases = done["phases"]
    order = ["process_start", "process_group_ready", "data_ready", "first_step", "end"]
    assert [phases[p] for p in order] == sorted(phases[p] for p in order)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "epoch-0001.pt",
        "epoch-0002.pt",
    ]


def test_single_process(data_dir: Path, tmp_path: Path) -> None:
    proc = _train(data_dir, tmp_path, "--strategy", "single", *SMALL)
    _check_run(tmp_path, "single", 1)
    # stderr is not a terminal here: plain progress lines, no carriage returns.
    assert "\r" not in proc.stdout + proc.stderr
    assert "epoch 1/2 step 20/63 loss" in proc.stdout


def test_ddp_under_torchrun(data_dir: Path, tmp_path: Path) -> None:
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
    proc = _train(data_dir, tmp_path, "--strategy", "ddp", *SMALL, launcher=torchrun)
    _check_run(tmp_path, "ddp", 2)
    assert proc.stdout.count("epoch 2/2: train_loss") == 1  # rank 0 reports, rank 1 is quiet
    assert "global batch 128 (64 per process), lr 0.05" in proc.stdout


def test_run_as_a_file_says_how_to_run_it() -> None:
    proc = _run([sys.executable, "jobs/mnist/train.py", "--help"])
    assert proc.returncode == 1
    assert proc.stderr == (
        "error: run it as a module from the repository root: python -m jobs.mnist.train\n"
    )


@pytest.mark.parametrize(
    ("recipe", "world", "batch_size", "lr", "expected"),
    [
        # The recipe's global batch is split: every world takes the same steps.
        ("fast", 1, None, None, (128, 128, 0.2)),
        ("fast", 4, None, None, (32, 128, 0.2)),
        ("fast", 3, None, None, (43, 129, 0.2 * 129 / 128)),  # rounded up, lr follows
        ("fast", 256, None, None, (1, 256, 0.4)),
        # A per-process batch grows the global one; the fast recipe's lr scales with it.
        ("fast", 4, 128, None, (128, 512, 0.8)),
        ("fast", 4, 128, 0.1, (128, 512, 0.1)),  # an explicit lr is taken as given
        ("reference", 4, None, None, (16, 64, 1.0)),
        ("reference", 2, 64, None, (64, 128, 1.0)),  # Adadelta: no lr scaling
    ],
)
def test_batching_scales_with_the_world(
    recipe: str, world: int, batch_size: int | None, lr: float | None, expected: tuple
) -> None:
    from jobs.mnist import recipes

    got = recipes.batching(recipes.RECIPES[recipe], world, batch_size, lr)
    assert (got.per_process, got.global_batch) == expected[:2]
    assert got.lr == pytest.approx(expected[2])


def test_ddp_from_slurm_variables_only(data_dir: Path, tmp_path: Path) -> None:
    """What `srun python train.py` gives each task: SLURM_* and nothing from torchrun."""
    job_id = 60000 + _free_port(29500, 49500) - 29500  # rendezvous_port(job_id) is that port
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                *TRAIN,
                "--strategy",
                "ddp",
                *SMALL,
                "--data-dir",
                str(data_dir),
                "--out-dir",
                str(tmp_path),
            ],
            cwd=ROOT,
            env=_clean_env(
                SLURM_PROCID=str(rank),
                SLURM_LOCALID=str(rank),
                SLURM_NTASKS="2",
                SLURM_NODEID="0",
                SLURM_TASKS_PER_NODE="2",
                SLURM_JOB_NODELIST="localhost",
                SLURM_JOB_ID=str(job_id),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    _check_run(tmp_path, "ddp", 2)
    assert all(line.startswith("[rank 1] ") for line in outputs[1].splitlines())


def test_accelerate_launch_two_cpu_processes(data_dir: Path, tmp_path: Path) -> None:
    _train(data_dir, tmp_path, "--strategy", "accelerate", *SMALL, launcher=accelerate_2())
    _check_run(tmp_path, "accelerate", 2)


def test_notebook_launcher(data_dir: Path, tmp_path: Path) -> None:
    argv = [
        "--strategy",
        "accelerate",
        *SMALL,
        "--data-dir",
        str(data_dir),
        "--out-dir",
        str(tmp_path),
    ]
    code = (
        "from accelerate import notebook_launcher\n"
        "from jobs.mnist import train\n"
        f"config = train.parse_args({argv!r})\n"
        f"notebook_launcher(train.train, (config,), num_processes=2, use_port='{_free_port()}')\n"
    )
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _check_run(tmp_path, "accelerate", 2)


def test_resume_continues_exactly(data_dir: Path, tmp_path: Path) -> None:
    """Stopped after epoch 1 (as if killed before epoch 2's checkpoint), then started again."""
    _train(data_dir, tmp_path, *SMALL)
    whole = _metrics(tmp_path)
    (tmp_path / "checkpoints" / "epoch-0002.pt").unlink()
    proc = _train(data_dir, tmp_path, *SMALL)
    assert "resuming at epoch 2" in proc.stdout
    assert "epoch 1/2 step" not in proc.stdout
    resumed = _metrics(tmp_path)
    assert [r.get("epoch") for r in resumed] == [1, 2, None]
    for key in ("train_loss", "test_loss", "test_acc"):  # bit for bit
        assert [r[key] for r in resumed[:2]] == [r[key] for r in whole[:2]]


def test_resume_refuses_a_different_schedule(data_dir: Path, tmp_path: Path) -> None:
    args = ["--recipe", "fast", "--limit-train", "1000", "--data-dir", str(data_dir)]
    _train(data_dir, tmp_path, *args, "--epochs", "1")
    proc = _run([sys.executable, *TRAIN, *args, "--epochs", "3", "--out-dir", str(tmp_path)])
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--no-resume" in proc.stderr, proc.stderr


def test_corrupted_data_is_refused(data_dir: Path, tmp_path: Path) -> None:
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        shutil.copyfile(data_dir / "MNIST" / "raw" / name, raw / name)
    with open(raw / "t10k-labels-idx1-ubyte", "r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 1]))
    proc = _run(
        [
            sys.executable,
            *TRAIN,
            "--data-dir",
            str(tmp_path / "data"),
            "--out-dir",
            str(tmp_path / "out"),
        ]
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "t10k-labels-idx1-ubyte is not the genuine MNIST file" in proc.stderr
    assert "prepare it where there is a network: python -m jobs.mnist.data" in proc.stderr


def test_missing_data_fails_at_once_in_one_line_from_rank_0_and_fetches_nothing(
    tmp_path: Path,
) -> None:
    """Inside a job the entrypoint never downloads: the nodes have no route out. Two ranks find
    the folder empty; rank 0 alone says so, naming the folder and the command that fills it."""
    data = tmp_path / "empty"
    proc = _run(
        [
            str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", *TRAIN,
            "--strategy", "ddp", "--data-dir", str(data), "--out-dir", str(tmp_path / "out"),
        ]
    )  # fmt: skip
    assert proc.returncode != 0
    said = [line for line in proc.stderr.splitlines() if "MNIST is not in" in line]
    assert said == [
        f"error: MNIST is not in {data}/MNIST/raw (missing train-images-idx3-ubyte, "
        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte); prepare it "
        f"where there is a network: python -m jobs.mnist.data --data-dir {data}"
    ], proc.stderr
    assert "preparing" not in proc.stdout + proc.stderr and not data.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy", "bogus"], "invalid choice: 'bogus'"),
        (["--target-acc", "99"], "is a fraction"),
        (["--epochs", "0"], "must be > 0"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_flag_is_one_line(args: list[str], message: str) -> None:
    proc = _run([sys.executable, *TRAIN, *args])
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_world_size_mismatch_fails_loudly(data_dir: Path, tmp_path: Path) -> None:
    proc = _run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            *TRAIN,
            "--strategy",
            "single",
            "--data-dir",
            str(data_dir),
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert proc.returncode != 0
    # Both ranks refuse; whichever does first, torchrun stops the other (SIGTERM), maybe before
    # it says so: the line of one rank is what is certain.
    assert re.search(
        r"--strategy single, but launched as rank [01] of 2 from torchrun", proc.stderr
    )
