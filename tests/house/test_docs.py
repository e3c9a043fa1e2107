"""The docs' promises: the site builds with every link whole, the field reference lists every
field of the spec, and every `clustertrain ...` example uses a real command with real flags
(the `submit` and `run` ones are run as dry runs)."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from clustertrain.spec import JobSpec
from tests.conftest import ROOT, run_cli

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict``; the hook imports this checkout's clustertrain."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        cwd=config.parent,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("site")
    done = _build(ROOT / "mkdocs.yml", path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return path


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f": {page.name}" in nav, f"{page.name} is not in mkdocs.yml's nav"


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The check can fail: the same site with one link to a page that is not there."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    with (tmp_path / "docs" / "index.md").open("a") as index:
        index.write("\nSee [the missing page](missing.md).\n")
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "missing.md" in done.stderr


def test_the_field_reference_lists_every_field(site: Path) -> None:
    page = (site / "fields" / "index.html").read_text()
    rows = re.findall(r"<tr>\s*<td><code>(\w+)</code></td>", page)
    assert rows == [field.name for field in dataclasses.fields(JobSpec)]
    assert "--sbatch-option" in page and "2 per process, at least 4" in page


# Examples --------------------------------------------------------------------------------------


def _examples() -> list[tuple[str, list[str]]]:
    """Every `clustertrain ...` line of the sh blocks, continuation lines joined, as words."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in re.finditer(r"```sh\n(.*?)```", text, re.DOTALL):
            start = text.count("\n", 0, block.start()) + 2
            for number, line in enumerate(block[1].replace("\\\n", " ").splitlines(), start):
                if line.startswith("clustertrain "):
                    found.append((f"{page.name}:{number}", shlex.split(line, comments=True)))
    return found


EXAMPLES = _examples()


@cache
def _help(command: tuple[str, ...]) -> str:
    done = run_cli(*command, "--help")
    assert done.returncode == 0, f"clustertrain {' '.join(command)}: {done.stderr}"
    return done.stdout


def _options(help_text: str) -> set[str]:
    """The option names a command's --help declares (its "Options:" lines, not its examples)."""
    names = set()
    for line in help_text.splitlines():
        declared = re.match(r"  (-\S.*?)(?:  |$)", line)
        if declared:
            names |= set(re.findall(r"--?[A-Za-z][\w-]*", declared[1]))
    return names


def _command(words: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(the subcommand's path, e.g. ("cluster", "up"), what follows it)."""
    path: tuple[str, ...] = ()
    rest = words[1:]
    while rest and not rest[0].startswith("-"):
        help_text = _help(path)
        if "Commands:" not in help_text:
            break
        commands = re.findall(r"^  (\w[\w-]*)  ", help_text.split("Commands:")[1], re.MULTILINE)
        assert rest[0] in commands, f"no command {rest[0]!r} in clustertrain {' '.join(path)}"
        path, rest = (*path, rest[0]), rest[1:]
    return path, rest


def unknown_flags(words: list[str]) -> list[str]:
    """The flags of an example that its command does not have (those after `--` belong to the
    training script)."""
    path, rest = _command(words)
    options = _options(_help(path))
    ours = rest[: rest.index("--")] if "--" in rest else rest
    return [w for w in ours if w.startswith("-") and w.split("=")[0] not in options]


def test_the_pages_have_examples() -> None:
    assert len(EXAMPLES) > 20
    assert any(words[1:3] == ["cluster", "up"] for _, words in EXAMPLES)


@pytest.mark.parametrize(("where", "words"), EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_an_example_uses_real_flags(where: str, words: list[str]) -> None:
    assert unknown_flags(words) == [], where


def test_an_example_with_a_flag_that_is_gone_is_caught() -> None:
    """The check can fail: a made-up flag, and a script's flag placed before `--`."""
    assert unknown_flags(["clustertrain", "submit", "--nodes", "2", "--nodez", "3"]) == ["--nodez"]
    assert unknown_flags(["clustertrain", "submit", "--epochs", "3"]) == ["--epochs"]
    assert unknown_flags(["clustertrain", "cluster", "fail", "node2", "--cut-links"]) == [
        "--cut-links"
    ]


# Only `submit` and `run` can run here: the other commands need a job id, a run folder or a
# Slurm cluster (logs, status, cancel, results, plot, doctor), or root (cluster up/fail/down);
# their flags are checked above. An example whose words the shell must expand first (`$(...)`)
# is left out too: its value is only known where it runs, and so is one for a login node
# (--host; tests/e2e/test_remote_e2e.py submits those).
DRY_RUNS = [
    (where, words)
    for where, words in EXAMPLES
    if words[1] in ("submit", "run")
    and not any("$" in word for word in words)
    and "--host" not in words
]


@pytest.mark.parametrize(("where", "words"), DRY_RUNS, ids=[where for where, _ in DRY_RUNS])
def test_a_submit_example_runs_as_a_dry_run(where: str, words: list[str], tmp_path: Path) -> None:
    args = words[1:]
    cut = args.index("--") if "--" in args else len(args)
    if "--dry-run" not in args:
        args = [*args[:cut], "--dry-run", *args[cut:]]
    done = run_cli(*args, env={"CLUSTERTRAIN_RUNS_DIR": str(tmp_path / "runs")})
    assert done.returncode == 0, f"{where}: {done.stderr}"
    assert not (tmp_path / "runs").exists(), "a dry run wrote a run folder"
