"""README's promises: its first two commands exist, and CI runs exactly its test command."""

from __future__ import annotations

import os
import re

from tests.conftest import ROOT


def _first_commands() -> list[str]:
    block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert block is not None
    return [line.split("#")[0].strip() for line in block[1].splitlines()]


def test_readme_opens_with_the_demo_and_the_test_command() -> None:
    demo, test = _first_commands()
    for command in (demo, test):
        assert os.access(ROOT / command, os.X_OK), command
    assert "clustertrain submit" in (ROOT / demo).read_text()
    assert "logs last --follow" in (ROOT / demo).read_text()


def test_ci_runs_the_readme_test_command() -> None:
    _, test = _first_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert f"exec {test}" in ci


def test_ci_runs_the_demo_cold_first_and_checks_its_job() -> None:
    """A fresh machine has no data cache: CI proves the newcomer's path before the suite."""
    demo, test = _first_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    cold = ci.index("cold=$(mktemp -d /tmp/clustertrain-ci.XXXXXX)")
    assert ci[cold + 1] == 'export CLUSTERTRAIN_DATA_DIR="$cold/mnist"'
    demo_line = ci.index(f'CLUSTERTRAIN_RUNS_DIR="$cold/runs" {demo}')
    check_line = ci.index("    .venv/bin/python scripts/check-demo")
    assert cold < demo_line < check_line < ci.index(f"exec {test}")


def test_the_test_command_fails_when_no_test_runs() -> None:
    script = (ROOT / "scripts" / "test").read_text()
    # pytest exits 5 when nothing was collected; set -e turns that into a failed CI run.
    assert "set -euo pipefail" in script and "pytest" in script and "|| true" not in script
