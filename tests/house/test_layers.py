"""The house's layers hold: import-linter's contracts (pyproject's [tool.importlinter]) pass,
and no module imports another inside a function unless it says why (start-up time)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def test_the_import_contracts_are_kept() -> None:
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in done.stdout


def test_a_contract_that_is_crossed_fails(tmp_path: Path) -> None:
    """The check can fail: a spec module importing a backend is reported."""
    config = tmp_path / "contracts.toml"
    config.write_text(
        (ROOT / "pyproject.toml").read_text()
        + "\n[[tool.importlinter.contracts]]\nname = 'spec may not import render'\n"
        "type = 'forbidden'\nsource_modules = ['clustertrain.render']\n"
        "forbidden_modules = ['clustertrain.spec']\n"
    )
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(config)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "spec may not import render BROKEN" in done.stdout


# The CLI's commands each import what they need when they run (so --help and a dry run stay
# fast, as clustertrain.cli.commands says once); the rank side imports torch only when used.
_LAZY_EVERYWHERE = ("clustertrain/cli/", "clustertrain/__init__.py")


def _imports_in_functions(path: Path) -> list[ast.Import | ast.ImportFrom]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
    return found


def test_every_import_inside_a_function_says_why() -> None:
    """An import placed in a function to dodge a circle is a circle: each must say "lazy"
    (start-up time) on its line or the line above, or import torch on the rank side."""
    unexplained = []
    for path in sorted((ROOT / "clustertrain").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(_LAZY_EVERYWHERE):
            continue
        lines = path.read_text().splitlines()
        for node in _imports_in_functions(path):
            names = [alias.name for alias in node.names]
            module = getattr(node, "module", None) or names[0]
            said = " ".join(lines[node.lineno - 2 : node.lineno])
            if "lazy" in said or module.split(".")[0] == "torch":
                continue
            unexplained.append(f"{relative}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert unexplained == [], "\n".join(unexplained)
