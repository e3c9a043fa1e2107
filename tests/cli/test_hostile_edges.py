"""Hostile input, round four (issue 49): types and sizes at the edges of the Python API, the
job file, the events file and the environment. Each is refused in one line (no traceback),
ignored with one warning, or taken literally and fast."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import clustertrain
from clustertrain import runs
from clustertrain.errors import FieldError
from clustertrain.notebook import notebook_launcher
from clustertrain.rank import events
from tests.cli.test_hostile_input import _assert_refused
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
HEX = "0x" + "f" * 5000


@pytest.mark.parametrize(
    ("call", "field", "said"),
    [
        (lambda: notebook_launcher(print, host=42), "host", "give a destination"),
        (lambda: notebook_launcher(print, host=["login"]), "host", "give a destination"),
        (lambda: clustertrain.submit(gpus_per_nod=2, dry_run=True, module="m"), "gpus_per_nod",
         "did you mean gpus_per_node"),
        (lambda: clustertrain.submit(nodez=2, dry_run=True, module="m"), "nodez",
         "did you mean nodes"),
        (lambda: clustertrain.submit(**{"a\nb": 1}, dry_run=True, module="m"), "'a\\nb'",
         "valid fields: name, nodes"),
    ],
)  # fmt: skip
def test_a_python_value_of_the_wrong_type_or_name_is_one_field_error(
    call: Any, field: str, said: str
) -> None:
    with pytest.raises(FieldError) as refused:
        call()
    assert str(refused.value).startswith(f"{field}: invalid value ") and said in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("content", "field"),
    [(f"args: [!!int {HEX}]\n", "args[0]"), (f"env: {{A: !!int {HEX}}}\n", "env.A"),
     (f"name: !!int {HEX}\n", "name"), (f"setup: [!!int {HEX}]\n", "setup[0]"),
     (f"nodes: !!int {HEX}\n", "nodes"), ("args: [!!int " + "9" * 5000 + "]\n", "job file")],
)  # fmt: skip
def test_an_explicit_integer_too_long_is_refused_before_it_is_converted(
    content: str, field: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    (tmp_path / "job.yaml").write_text(content)
    done = run_cli("submit", str(tmp_path / "job.yaml"), cwd=tmp_path, env=env)
    _assert_refused(done, field, tmp_path, called)
    assert done.stderr.startswith(f"clustertrain: error: {field}: invalid value ")


LONG = "/tmp/" + "x" * 300


@pytest.mark.parametrize("argv", [["list"], ["status", "last"], ["submit", "--dry-run"],
                                  ["logs", "7"], ["nodes"]])  # fmt: skip
def test_a_runs_dir_longer_than_a_file_name_is_one_line(argv: list[str], tmp_path: Path) -> None:
    done = run_cli(*argv, env={"CLUSTERTRAIN_RUNS_DIR": LONG, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.startswith("clustertrain: error: runs dir: ") and "Traceback" not in done.stderr
    )
    assert len(done.stderr.splitlines()) == 1


def test_a_config_home_that_is_a_file_stops_no_dry_run(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "PYTHONPATH": str(ROOT),
           "CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")}  # fmt: skip
    done = run_cli("submit", "--dry-run", "--module", "m", env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_a_megabyte_of_args_is_rendered_whole(tmp_path: Path) -> None:
    # How fast: bench/edges.py (docs/benchmarks.md); speed is never a test's assert.
    args = [f"--x={i:07d}" for i in range(100_000)]
    job = clustertrain.submit(dry_run=True, module="m", args=args, runs_dir=str(tmp_path / "runs"))
    text = job.dry_run_text()
    assert "--x=0000000" in text and "--x=0099999" in text


def _run_folder(root: Path, lines: list[str]) -> runs.Run:
    folder = root / "big-20261203-100000-aaaaaa"
    (folder / "logs").mkdir(parents=True)
    now = time.time() - 3600
    record = {
        "job_id": "7",
        "name": "big",
        "nodes": 1,
        "world_size": 1,
        "launcher": "torchrun",
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now - 10)),
    }
    (folder / runs.RECORD).write_text(json.dumps(record))  # fmt: skip
    head = [f'{{"time": {now}, "event": "started", "attempt": 0}}']
    (folder / "events.jsonl").write_text(
        "\n".join(head + [s.replace("{t}", str(now)) for s in lines]) + "\n"
    )
    return runs.read_run(folder)


@pytest.mark.parametrize("value", ["1e308", "-1e308", "1e19", "1e300"])
def test_a_number_out_of_range_in_an_event_leaves_it_out(tmp_path: Path, value: str) -> None:
    run = _run_folder(tmp_path, [
        '{"time": {t}, "event": "metrics", "attempt": 0, "step": ' + value + ', "loss": 1}',
        '{"time": {t}, "event": "metrics", "attempt": 0, "step": 2, "loss": ' + value + "}",
        '{"time": {t}, "event": "metrics", "attempt": 0, "step": 3, "loss": 0.5}',
    ])  # fmt: skip
    said: list[str] = []
    assert [e.values["step"] for e in run.events(said.append) if e.name == "metrics"] == [3]
    assert said and "2 line(s) left out" in said[0]
    pytest.importorskip("matplotlib")
    from clustertrain.runs import plot

    plot.draw(run, tmp_path / "plot.png")


def test_a_plot_of_a_million_steps_keeps_a_bounded_number_of_points(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from clustertrain.runs import plot

    metric = '{"time": {t}, "event": "metrics", "attempt": 0, "step": I, "loss": 0.5}'
    step = '{"time": {t}, "event": "step", "attempt": 0, "step": I}'
    made = [(metric if i % 2 else step).replace("I", str(i)) for i in range(1_000_000)]
    run = _run_folder(tmp_path, made)
    plot.draw(run, tmp_path / "plot.png")  # how fast: bench/edges.py
    kept = events.scan(run.events_path, most=plot.POINTS)[0]
    assert plot.POINTS <= sum(e.name == "metrics" for e in kept) <= 3 * plot.POINTS
    assert kept[-1].values["step"] == 999_999  # the last progress is kept
