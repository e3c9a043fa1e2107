"""A job's setup lines as bash runs them: the rendered batch script's setup block, and the launch
script's node setup block, run here by bash (no Slurm), with the lines users write and the
lines an attacker would: each runs as its author's own shell, what it sets reaches what follows,
one that fails ends the script in one line naming it and its exit status, and none can reach
into another line of the script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from clustertrain.errors import FieldError
from clustertrain.render import render
from tests.conftest import job_spec

RUN_DIR, WORKDIR = "/shared/runs/setup", "/shared/project"


def _batch(lines: list[str], after: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The batch script up to its supervisor, then ``after``, run by bash in ``cwd``."""
    script = render(job_spec(setup=lines), RUN_DIR, WORKDIR).batch_script
    head = script.split("# The supervisor checks the nodes")[0]
    return _bash(head + after + "\n", cwd)


def _node(lines: list[str], after: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The launch script's node setup block, then ``after``, as a node's bash runs it."""
    script = render(job_spec(node_setup=lines), RUN_DIR, WORKDIR).launch_script
    block = script[script.index("# The job's node setup lines") : script.index("exec torchrun")]
    return _bash("set -euo pipefail\n" + block + after + "\n", cwd, SLURMD_NODENAME="node7")


def _bash(text: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", text], cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(cwd), **env},
    )  # fmt: skip


def test_what_a_setup_line_sets_reaches_the_rest_of_the_job(tmp_path: Path) -> None:
    lines = [
        "export SITE_ROOT=/site",
        'export DATA="$SITE_ROOT/data"  # a comment ends the line, as in your shell',
        "declare -x DECLARED=yes; PLAIN=kept",
        "cd /",
        "f() { echo \"from a function: $1\"; }; f 'it'\"'\"'s'",
    ]
    done = _batch(lines, 'echo "$DATA $DECLARED $PLAIN $(pwd)"', tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["from a function: it's", "/site/data yes kept /"]


def test_a_failing_setup_line_ends_the_job_in_one_line_before_the_rest(tmp_path: Path) -> None:
    lines = ["true", "ls /no/such/folder >/dev/null 2>&1", "echo not reached"]
    done = _batch(lines, "echo NOT REACHED", tmp_path)
    assert done.returncode == 1 and "reached" not in done.stdout.lower()
    assert done.stderr.splitlines() == [
        "clustertrain: setup line 2 failed (exit 2): ls /no/such/folder >/dev/null 2>&1"
    ]
    done = _batch(["g() { return 7; }; g"], "echo NOT REACHED", tmp_path)
    said = "clustertrain: setup line 1 failed (exit 7): g() { return 7; }; g"
    assert done.stderr.splitlines() == [said] and done.returncode == 1


@pytest.mark.parametrize(
    "line",
    [
        "echo hi; }",  # would close a group of the script's
        "echo 'unclosed",  # would swallow the script's next lines
        "if true; then",  # would open a block the script never closes
        "' ; touch PWNED ; '",  # would end the quoting the renderer put around it
    ],
)
def test_a_line_cannot_reach_into_the_scripts_other_lines(line: str, tmp_path: Path) -> None:
    """Each is a bad line of shell of its own: it fails alone, as a line typed at a prompt
    would, and the script around it reads as rendered."""
    done = _batch(["export BEFORE=1", line], 'echo "after: $BEFORE"', tmp_path)
    assert done.returncode == 1 and "after" not in done.stdout
    assert done.stderr.splitlines()[-1].startswith("clustertrain: setup line 2 failed (exit ")
    assert done.stderr.splitlines()[-1].endswith(f"): {line}")
    assert not (tmp_path / "PWNED").exists()


def test_a_heredoc_reads_none_of_the_scripts_lines(tmp_path: Path) -> None:
    """Its text ends with the line: bash warns and reads an empty document."""
    done = _batch(["cat <<EOF", "export AFTER=1"], 'echo "after: $AFTER"', tmp_path)
    assert done.returncode == 0 and done.stdout == "after: 1\n", done.stderr


def test_the_scripts_strict_mode_is_back_after_the_lines(tmp_path: Path) -> None:
    """The lines run as a prompt runs them (an unset variable is empty, a pipeline's status is
    its last command's); the script after them is strict again, even after `set +e`."""
    lines = ['echo "[$NOT_SET]"', "false | true", "set +e"]
    done = _batch(lines, 'echo "$NOT_SET_EITHER"', tmp_path)
    assert done.stdout.splitlines() == ["[]"]
    assert done.returncode != 0 and "NOT_SET_EITHER: unbound variable" in done.stderr


def test_a_failing_node_setup_line_names_its_node_and_ends_before_the_launcher(
    tmp_path: Path,
) -> None:
    done = _node(["export STAGED=/tmp/x", "test -d /no/such/dir"], "echo LAUNCHER", tmp_path)
    assert done.returncode == 1 and "LAUNCHER" not in done.stdout
    assert done.stderr.splitlines() == [
        "clustertrain: node_setup line 2 failed on node7 (exit 1): test -d /no/such/dir"
    ]
    done = _node(["export STAGED=/tmp/x", "ulimit -n 256"], 'echo "$STAGED $(ulimit -n)"', tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["/tmp/x", "256"], done.stderr


@pytest.mark.parametrize(
    ("lines", "named"),
    [
        (["a\nb"], "setup[0]"),  # a second line inside one
        (["ok", "a\x00b"], "setup[1]"),
        (["a\rb"], "setup[0]"),  # a carriage return would hide what runs in the dry run
        (["\x1b[2Jclear"], "setup[0]"),  # a terminal escape
        (["\u202eevil"], "setup[0]"),  # text that reads backwards
        ([""], "setup[0]"),
        (["   "], "setup[0]"),
        (["x" * 5000], "setup[0]"),
        ([["a"]], "setup[0]"),
        ([7], "setup[0]"),
        (["true"] * 65, "setup"),
        ({"a": 1}, "setup"),
    ],
)
def test_a_line_that_is_not_one_line_of_text_is_refused(lines: Any, named: str) -> None:
    for field in ("setup", "node_setup"):
        with pytest.raises(FieldError) as caught:
            job_spec(**{field: lines})
        assert caught.value.field == named.replace("setup", field, 1)
        assert "\n" not in str(caught.value)
