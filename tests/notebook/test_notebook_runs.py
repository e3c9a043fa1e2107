"""notebook_launcher running jobs on this machine (``backend="local"``): from this process, and
from a notebook in a real Jupyter kernel (nbclient, ipykernel), as a user's cell runs it."""

from __future__ import annotations

import io
import os
import re
import signal
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import clustertrain
from clustertrain.notebook import JobFailed
from tests.conftest import ROOT
from tests.notebook.test_notebook import in_a_notebook

ONE_WORLD = """
def one_world(base):
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} joined", flush=True)
    world = dist.get_world_size()
    return {"rank": int(os.environ["RANK"]), "world": world, "sum": base + total.item()}
"""

FAIL_ON_RANK_1 = """
def fail_on_rank_1():
    import os, time
    if os.environ["RANK"] == "1":
        raise ValueError("boom on rank 1")
    time.sleep(60)
"""


def test_rank_0s_value_comes_back_from_one_world(tmp_path: Path) -> None:
    shown = io.StringIO()
    value = clustertrain.notebook_launcher(
        in_a_notebook(ONE_WORLD), (10.0,), nodes=1, procs_per_node=2, launcher="torchrun",
        backend="local", runs_dir=str(tmp_path / "runs"), out=shown,
    )  # fmt: skip
    assert value == {"rank": 0, "world": 2, "sum": 13.0}
    lines = shown.getvalue().splitlines()
    assert re.fullmatch(
        r"clustertrain: job local-\d+ started: 1 node\(s\) x 2 process\(es\), torchrun; run "
        r"folder \S+/runs/one_world-\S+",
        lines[0],
    ), lines[0]
    assert re.fullmatch(
        r"clustertrain: job local-\d+ RUNNING on \S+: the ranks are starting", lines[1]
    )
    joined = sorted(line.split(" ", 1)[1] for line in lines if " joined" in line)
    assert joined == ["rank0 | rank 0 of 2 joined", "rank1 | rank 1 of 2 joined"], lines
    assert re.fullmatch(r"clustertrain: job local-\d+ ended COMPLETED", lines[-1])


def test_a_failing_rank_is_one_exception_naming_it(tmp_path: Path) -> None:
    shown = io.StringIO()
    with pytest.raises(JobFailed) as failed:
        clustertrain.notebook_launcher(
            in_a_notebook(FAIL_ON_RANK_1), nodes=2, procs_per_node=1, launcher="torchrun",
            backend="local", runs_dir=str(tmp_path / "runs"), out=shown,
        )  # fmt: skip
    said = str(failed.value)
    assert re.fullmatch(
        r"job (local-\d+) ended FAILED: rank 1 on \S+ raised ValueError: boom on rank 1 "
        r"\(its lines: clustertrain logs \1 --rank 1\)",
        said,
    ), said
    assert failed.value.rank == 1 and failed.value.job.state == "FAILED"
    # The cause status prints (clustertrain.runs.why), the same object the API returns.
    assert failed.value.cause == failed.value.job.failure
    # The traceback streamed as the rank's lines, and the launcher's report folded.
    assert "rank1 ! ValueError: boom on rank 1" in shown.getvalue()
    assert "lines folded (a launcher's failure report)" in shown.getvalue()


# In a real kernel ------------------------------------------------------------------------------

SETUP = "import clustertrain\nRUNS = {runs!r}\n"
# Accelerate's own Accelerator(), on this machine's CPUs: the local run (as the launch script on
# a node without a GPU) sets ACCELERATE_USE_CPU, so its 2 processes are one world, not two.
ACCELERATE_WORLD = """
def accelerate_world():
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0]), "sum")
    print(f"process {accelerator.process_index} on {accelerator.device.type}", flush=True)
    return accelerator.num_processes, accelerator.device.type, total.item()

clustertrain.notebook_launcher(accelerate_world, nodes=2, procs_per_node=1, backend="local",
                               runs_dir=RUNS)
"""
SLEEPER = """
def sleeper():
    import os, pathlib, time
    out = pathlib.Path(os.environ["CLUSTERTRAIN_OUT_DIR"])
    (out / f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
    print("sleeping", flush=True)
    time.sleep(300)

clustertrain.notebook_launcher(sleeper, procs_per_node=2, launcher="torchrun", backend="local",
                               runs_dir=RUNS)
"""


def _text(cell: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream")


def interrupt_when_asleep(
    client: NotebookClient, runs: Path, within_s: float = 120
) -> threading.Thread:
    """Interrupt the kernel as Jupyter's stop button does (SIGINT to its process group), once
    both ranks of the cell's job (``sleeper``) sleep."""

    def watch() -> None:
        deadline = time.monotonic() + within_s
        while len(list(runs.glob("sleeper-*/out/pid-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        os.killpg(client.km.provisioner.pgid, signal.SIGINT)  # type: ignore[union-attr]

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_a_notebook_cell_runs_one_world_and_an_interrupted_cell_cancels_its_job(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in
               (SETUP.format(runs=str(runs)), ACCELERATE_WORLD, SLEEPER)]
    )  # fmt: skip
    client = NotebookClient(
        notebook, timeout=240, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(ROOT)}},
    )  # fmt: skip
    with client.setup_kernel():
        for index in (0, 1):
            client.execute_cell(notebook.cells[index], index)
        watcher = interrupt_when_asleep(client, runs)
        client.execute_cell(notebook.cells[2], 2)
        watcher.join()

    world = notebook.cells[1]
    assert [out.output_type for out in world.outputs][-1] == "execute_result", world.outputs
    assert world.outputs[-1].data["text/plain"] == "(2, 'cpu', 3.0)"
    shown = _text(world)
    assert "rank0 | process 0 on cpu" in shown and "rank1 | process 1 on cpu" in shown, shown

    sleeper = notebook.cells[2]
    shown = _text(sleeper)
    assert shown.count("| sleeping") == 2, shown
    found = re.search(r"clustertrain: cell interrupted: job (local-\d+) cancelled \((\w+)\)", shown)
    assert found and found[2] == "CANCELLED", shown
    assert [out.ename for out in sleeper.outputs if out.output_type == "error"] == [
        "KeyboardInterrupt"
    ]
    job = clustertrain.Job.attach(found[1], runs_dir=str(runs))
    assert job.state == "CANCELLED"
    pids = [int(p.read_text()) for p in job.run.out_dir.glob("pid-*")]
    deadline = time.monotonic() + 30
    while not all(map(_gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(pids) == 2 and all(map(_gone, pids)), "a rank outlived its cancelled job"
