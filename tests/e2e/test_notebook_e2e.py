"""From a notebook to the real local cluster: docs/notebooks/mnist.ipynb run by a real Jupyter
kernel (nbclient, ipykernel). Its cell trains the tutorial's Accelerate function on 2 nodes x 2
processes as one world of 4, every rank's lines stream into the cell and rank 0's metrics come
back; a cell interrupted as Jupyter's stop button does cancels its Slurm job, and nothing is
left in the queue."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import ROOT
from tests.e2e.test_slurm_e2e import QUICK, _slurm_env, cluster  # noqa: F401 (a fixture)
from tests.notebook.test_notebook_runs import interrupt_when_asleep

pytestmark = pytest.mark.slurm

NOTEBOOK = ROOT / "docs" / "notebooks" / "mnist.ipynb"
# The notebook's first cell, as the test sets it: the script path's quick options
# (tests/e2e/test_slurm_e2e.py's accelerate test), runs in the test's own folder.
SHAPE = """
NODES, PROCS_PER_NODE = 2, 2
EPOCHS = {epochs}
QUICK = {quick!r}
RUNS_DIR = {runs!r}
BACKEND = "slurm"
"""
SLEEPER = """
def sleeper():
    import os, pathlib, time
    out = pathlib.Path(os.environ["CLUSTERTRAIN_OUT_DIR"])
    (out / f"pid-{os.environ['RANK']}").write_text(os.environ["SLURMD_NODENAME"])
    print("sleeping", flush=True)
    time.sleep(600)

clustertrain.notebook_launcher(sleeper, nodes=2, procs_per_node=1, launcher="torchrun",
                               runs_dir=RUNS_DIR, time="00:15:00", cpus_per_task=1)
"""


def _text(cell: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream")


def test_the_notebook_trains_one_world_of_4_on_2_nodes_and_an_interrupt_cancels_its_job(
    cluster: None,  # noqa: F811
    tmp_path: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = tmp_path / "runs"
    for name, value in _slurm_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CLUSTERTRAIN_DATA_DIR", str(data_dir))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    code[0].source = SHAPE.format(epochs=2, quick=QUICK[2:-2], runs=str(runs))
    notebook.cells.append(nbformat.v4.new_code_cell(SLEEPER))
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(ROOT)}},
    )  # fmt: skip
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells[:-1]):
            client.execute_cell(cell, index)
        watcher = interrupt_when_asleep(client, runs, within_s=240)
        client.execute_cell(notebook.cells[-1], len(notebook.cells) - 1)
        watcher.join()

    trained, said = code[2], _text(code[3])
    assert not [out for out in trained.outputs if out.output_type == "error"], trained.outputs
    shown = _text(trained)
    assert re.search(r"clustertrain: job \d+ RUNNING on node\[1-2\]: the ranks are starting", shown)
    ranks = set(re.findall(r"^node\d rank(\d) ", shown, re.MULTILINE))
    assert ranks == {"0", "1", "2", "3"}, shown[-3000:]
    assert re.search(r"clustertrain: job \d+ ended COMPLETED$", shown.rstrip()), shown[-2000:]
    found = re.fullmatch(r"test accuracy (\d+\.\d)% over a world of 4\n", said)
    assert found and float(found[1]) >= 85.0, said
    print(said.strip())

    sleeper = _text(notebook.cells[-1])
    assert sleeper.count("| sleeping") == 2, sleeper
    cancelled = re.search(r"cell interrupted: job (\d+) cancelled \((\w+)\)", sleeper)
    assert cancelled and cancelled[2] == "CANCELLED", sleeper
    errors = [out.ename for out in notebook.cells[-1].outputs if out.output_type == "error"]
    assert errors == ["KeyboardInterrupt"]
    queue = subprocess.run(["squeue", "-h", "-j", cancelled[1]], capture_output=True, text=True,
                           env={**os.environ, **_slurm_env()}, check=False)  # fmt: skip
    assert queue.stdout.strip() == "", queue.stdout
