"""``submit`` with spare nodes qualifies unless told not to, as users run it: the dry run says so
in one line before the scripts, ``--no-qualify`` and ``qualify: false`` turn it off, and
``--help`` states the default."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_cli

NOTE = (
    "#### qualification: on (spare_nodes: 1 asks for bad nodes to be swapped; --no-qualify or "
    "qualify: false turns it off)"
)


def _dry_run(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[str, dict[str, object]]:
    """The dry run's text and its plan.json."""
    done = run_cli("submit", "--module", "pkg.train", *args, "--dry-run", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name != "job.yaml"] == []  # writes nothing
    plan = re.search(r"^#### \S+/plan.json .*\n(\{\n.*?\n\})\n", done.stdout, re.M | re.S)
    assert plan is not None, done.stdout
    return done.stdout, json.loads(plan.group(1))


def test_spare_nodes_turn_qualification_on_and_the_dry_run_says_so_first(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    text, plan = _dry_run(tmp_path, cli_env, "--nodes", "2", "--spare-nodes", "1")
    assert text.splitlines()[0] == NOTE  # before the scripts
    assert text.count("qualification: on") == 1
    assert plan["qualify"] is True and "--qualify" in plan["node_check"]  # type: ignore[operator]


@pytest.mark.parametrize(
    ("args", "job_file", "qualified"),
    [
        (["--spare-nodes", "1", "--no-qualify"], "", False),
        ([], "spare_nodes: 1\nqualify: false\n", False),
        (["--qualify"], "", True),  # said plainly by the job: nothing new to say
        ([], "", False),
    ],
)
def test_what_the_job_says_wins_and_the_dry_run_adds_no_line(
    args: list[str], job_file: str, qualified: bool, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    if job_file:
        (tmp_path / "job.yaml").write_text(job_file)
        args = ["job.yaml", *args]
    text, plan = _dry_run(tmp_path, cli_env, *args)
    assert "qualification:" not in text
    assert plan.get("qualify", False) is qualified


def test_qualify_maybe_in_a_job_file_is_one_line_exit_2_nothing_written(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("module: pkg.train\nspare_nodes: 1\nqualify: maybe\n")
    done = run_cli("submit", str(job), "--dry-run", cwd=tmp_path, env=cli_env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "clustertrain: error: qualify: invalid value 'maybe'; must be true or false, or left out "
        "(then on with spare_nodes, else off)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


def test_help_states_the_default_and_the_switch_off() -> None:
    done = run_cli("submit", "--help")
    text = " ".join(done.stdout.split())
    assert "--qualify / --no-qualify" in text
    assert "(default: on with spare_nodes, else off)" in text
