"""A corpus of malicious and malformed values through the CLI, as users would type them.

Each is either refused (exit 2, one line naming the field, nothing written, sbatch never
called) or reproduced literally in the rendered job; nothing in it is ever executed.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from clustertrain.spec import sbatch
from tests.conftest import run_cli

SHELL = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "'; touch PWNED #",
    '"; touch PWNED #',
    "a && touch PWNED",
    "a | touch PWNED",
    "> PWNED",
    "$((6*7))",
    "${IFS}x",
    "~root",
    "naïve ☃ 日本語",
    "a\tb c",
]

# (flags, field named in the refusal)
REFUSED: list[tuple[list[str], str]] = [
    (["--name", "a\nb"], "name"),
    (["--name", "x" * 10_000], "name"),
    (["--name", "\u202eevil"], "name"),
    (["--name", "a\tb"], "name"),
    (["--name", "%j"], "name"),
    (["--partition", "gpu;reboot"], "partition"),
    (["--partition", "$(id)"], "partition"),
    (["--account", "`id`"], "account"),
    (["--qos", "a b"], "qos"),
    (["--constraint", "a100&&$(id)"], "constraint"),
    (["--mem", "64G;rm"], "mem"),
    (["--dependency", "afterok:1;id"], "dependency"),
    (["--mail-user", "a@b;id"], "mail_user"),
    (["--mail-type", "ALL,$(id)"], "mail_type"),
    (["--env", "PATH;x=1"], "env key"),
    (["--env", "=x"], "env key"),
    (["--env", "noequals"], "env"),
    (["--sbatch-option", "--nodes=2"], "sbatch_options"),
    (["--sbatch-option", "-N2"], "sbatch_options"),
    (["--sbatch-option", "--wrap=x\ny"], "sbatch_options"),
    (["--sbatch-option", "--x;id"], "sbatch_options"),
    (["--sbatch-option", "--tres-per-task=cpu:4"], "sbatch_options"),  # 24.11: a field's
    (["--time", "99999999"], "time"),
    (["--time", "-1"], "time"),
    (["--time", "1:2:3:4"], "time"),
    (["--time", "$(id)"], "time"),
    (["--nodes", "99999999999"], "nodes"),
    (["--nodes", "-5"], "nodes"),
    (["--gpus-per-node", "1e3"], "gpus_per_node"),
    (["--gpus-per-node", "65"], "gpus_per_node"),
    (["--cpus-per-task", "0"], "cpus_per_task"),
    # Resources per GPU: out of range, not a size, beside their per-node twin, without GPUs.
    (["--gpus-per-node", "2", "--cpus-per-gpu", "0"], "cpus_per_gpu"),
    (["--gpus-per-node", "2", "--cpus-per-gpu", "-4"], "cpus_per_gpu"),
    (["--gpus-per-node", "2", "--cpus-per-gpu", "99999999999999"], "cpus_per_gpu"),
    (["--gpus-per-node", "2", "--cpus-per-gpu", "4", "--cpus-per-task", "8"], "cpus_per_gpu"),
    (["--gpus-per-node", "0", "--cpus-per-gpu", "4"], "cpus_per_gpu"),
    (["--gpus-per-node", "1", "--mem-per-gpu", "12XB"], "mem_per_gpu"),
    (["--gpus-per-node", "1", "--mem-per-gpu", "-4G"], "mem_per_gpu"),
    (["--gpus-per-node", "1", "--mem-per-gpu", "0"], "mem_per_gpu"),
    (["--gpus-per-node", "1", "--mem-per-gpu", "99999T"], "mem_per_gpu"),
    (["--gpus-per-node", "1", "--mem-per-gpu", "8G;id"], "mem_per_gpu"),
    (["--gpus-per-node", "1", "--mem-per-gpu", "8G", "--mem", "64G"], "mem_per_gpu"),
    (["--gpus-per-node", "0", "--mem-per-gpu", "8G"], "mem_per_gpu"),
    (["--sbatch-option", "--cpus-per-gpu=2"], "sbatch_options"),
    (["--sbatch-option", "--mem-per-gpu=2G"], "sbatch_options"),
    # Setup lines: one line of text each.
    (["--setup", "a\nb"], "setup[0]"),
    (["--setup", "true", "--setup", "a\rb"], "setup[1]"),
    (["--setup", ""], "setup[0]"),
    (["--setup", "\x1b]0;title\x07"], "setup[0]"),
    (["--node-setup", "x" * 5000], "node_setup[0]"),
    (["--node-setup", "ulimit -n 1\nrm -rf ~"], "node_setup[0]"),
    (["--launcher", "torchrun; id"], "launcher"),
    (["--script", "-c"], "script"),
    (["--script", "a\nb.py"], "script"),
    (["--module", "-c"], "module"),
    (["--module", "x;$(id)"], "module"),
    (["--module", "pkg.train", "--script", "t.py"], "module"),
    (["--venv", "relative/venv"], "venv"),
    (["--signal-lead", "0"], "signal_lead_s"),
    (["--max-restarts", "1000"], "max_restarts"),
    (["--", "x" * 5000], "args[0]"),
    *[
        (["--container-runtime", runtime, f"--container-image={image}"], "container_image")
        for runtime, image in [
            ("apptainer", "--writable"),
            ("pyxis", "img;id"),
            ("pyxis", "a b"),
            ("pyxis", "$(touch PWNED)"),
            ("oci", "relative/rootfs"),
        ]
    ],
    (["--container-image", "/images/t.sif"], "container_runtime"),
    (["--container-image", "/i", "--container-runtime", "docker"], "container_runtime"),
    (["--container-runtime", "pyxis"], "container_runtime"),
    (["--container-mount", "/data"], "container_mounts"),
    (["--container-env", "A=1"], "container_env"),
    *[
        (
            ["--container-image", "/i", "--container-runtime", "apptainer", "--container-mount", m],
            "container_mounts",
        )
        for m in ["data:/data", "/a,/b", "/a:/b:rx", "/$(id)", "/a b", "/a:b"]
    ],
    (
        ["--container-image", "/i", "--container-runtime", "oci", "--container-env", "SLURM_X=1"],
        "container_env key",
    ),
]

# (job file text, field named in the refusal)
REFUSED_FILES: list[tuple[str, str]] = [
    (
        "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
        "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nargs: [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n",
        "job file",
    ),
    ("x: &x [a,a,a,a,a,a,a,a,a]\ny: &y [*x,*x,*x,*x,*x,*x,*x,*x,*x]\n", "job file"),
    ("args: &y [[a,a],[a,a]]\n", "job file"),
    ("args: [[a,a],[a,a]]\n", "args[0]"),
    ("name: [a, b]\n", "name"),
    ("nodes: 1e9\n", "nodes"),
    ("nodes: '4'\n", "nodes"),
    ("nodes: .inf\n", "nodes"),
    ("nodes: true\n", "nodes"),
    ("nodes: null\n", "nodes"),
    ("env: {A: [1, 2]}\n", "env.A"),
    ("env: !!python/object/apply:os.system ['touch PWNED']\n", "job file"),
    ("args: {a: 1}\n", "args"),
    ("name: !!binary aGVsbG8=\n", "name"),
    ("time: 2020-01-01\n", "time"),
    ("1: 2\n", "1"),
    ('name: "a\\0b"\n', "name"),
    ('env: {A: "x\\0y"}\n', "env.A"),
    ("[" * 50_000 + "]" * 50_000 + "\n", "job file"),
    ("- nodes: 2\n", "job file"),
    ("nodes: 2\nnodes: [\n", "job file"),
    ("\xff\xfe garbage", "job file"),
    ("gpus_per_node: -1\n", "gpus_per_node"),
    ('setup: ["a\\0b"]\n', "setup[0]"),
    ('setup: "ok\\nrm -rf ~"\n', "setup[0]"),
    ("setup: {a: 1}\n", "setup"),
    ("setup: [[a, b]]\n", "setup[0]"),
    ("node_setup: [true]\n", "node_setup[0]"),
    ("gpus_per_node: 2\ncpus_per_gpu: 0\n", "cpus_per_gpu"),
    ("gpus_per_node: 2\ncpus_per_gpu: 1e3\n", "cpus_per_gpu"),
    ("gpus_per_node: 2\ncpus_per_gpu: 2\ncpus_per_task: 8\n", "cpus_per_gpu"),
    ("gpus_per_node: 1\nmem_per_gpu: 12XB\n", "mem_per_gpu"),
    ("gpus_per_node: 1\nmem_per_gpu: 16\nmem: 64G\n", "mem_per_gpu"),
    ("module: m\ngpus_per_node: 0\nmem_per_gpu: 8G\n", "mem_per_gpu"),
]

# (flags, the text that must appear in the rendered job: bash-quoted in the scripts'
# commands, sbatch-quoted on #SBATCH lines)
LITERAL: list[tuple[list[str], str]] = [
    *[(["--", value], shlex.quote(value)) for value in SHELL],
    *[(["--env", f"USER_VALUE={value}"], shlex.quote(value)) for value in SHELL],
    *[
        (["--name", value], f"#SBATCH --job-name={sbatch.quote(value)}\n")
        for value in SHELL
        if not sbatch.UNSAFE.search(value)
    ],
    (["--script", "$(touch PWNED).py"], shlex.quote("$(touch PWNED).py")),
    (["--venv", "/opt/$(touch PWNED)"], shlex.quote("/opt/$(touch PWNED)")),
    (["--sbatch-option", "--comment=$(touch PWNED)"], '#SBATCH --comment="$(touch PWNED)"\n'),
    # A setup line is the user's own shell, rendered as one word for eval: never run here.
    *[(["--setup", value], f"eval -- {shlex.quote(value)} || ") for value in SHELL],
    *[(["--node-setup", value], f"eval -- {shlex.quote(value)} || ") for value in SHELL],
    *[
        (
            ["--container-image", "/i", "--container-runtime", "oci", "--container-env", f"V={v}"],
            f"export V={shlex.quote(v)}\n",
        )
        for v in SHELL
    ],
]


def _assert_refused(done: object, field: str, sandbox: Path, called: Path) -> None:
    assert done.returncode == 2, done.stdout + done.stderr  # type: ignore[attr-defined]
    lines = done.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("clustertrain: error: "), lines
    assert field in lines[0] and "Traceback" not in lines[0]
    assert not called.exists() and not (sandbox / "runs").exists()
    assert not list(sandbox.glob("PWNED")) and not Path("PWNED").exists()


def test_the_corpus_is_large_enough() -> None:
    assert len(REFUSED) + len(REFUSED_FILES) + len(LITERAL) >= 50


@pytest.mark.parametrize(("flags", "field"), REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_refused_flags(
    flags: list[str], field: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    done = run_cli("submit", *flags, cwd=tmp_path, env=env)
    _assert_refused(done, field, tmp_path, called)


@pytest.mark.parametrize(
    ("content", "field"), REFUSED_FILES, ids=[str(i) for i in range(len(REFUSED_FILES))]
)
def test_refused_job_files(
    content: str, field: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    job = tmp_path / "job.yaml"
    job.write_bytes(
        content.encode("utf-8", "surrogateescape")
        if "\xff" not in content
        else content.encode("latin-1")
    )
    done = run_cli("submit", str(job), cwd=tmp_path, env=env)
    _assert_refused(done, field, tmp_path, called)
    assert field == "job file" or done.stderr.split("error: ")[1].startswith(field)


@pytest.mark.parametrize(("flags", "text"), LITERAL, ids=[str(i) for i in range(len(LITERAL))])
def test_accepted_values_are_literal(
    flags: list[str], text: str, tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    done = run_cli("submit", "--dry-run", *flags, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert text in done.stdout
    assert list(tmp_path.iterdir()) == [tmp_path / "bin"] and not called.exists()


def test_a_job_file_that_cannot_be_read_is_one_line(
    tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    folder = tmp_path / "job.yaml"
    folder.mkdir()
    done = run_cli("submit", str(folder), cwd=tmp_path, env=env)
    _assert_refused(done, "job.yaml", tmp_path, called)


def test_brackets_inside_quotes_and_comments_are_not_nesting(tmp_path: Path) -> None:
    """The nesting bound (checked before PyYAML, which takes a minute of CPU on 50,000 nested
    brackets) counts flow collections only."""
    from clustertrain.spec.jobfile import MAX_FLOW_DEPTH, parse

    deep = "[" * (MAX_FLOW_DEPTH + 1)
    text = f"args: ['{deep}', \"{deep}\"]  # {deep}\nenv: {{A: '{{{{'}}\n"
    assert parse(text.encode())["args"] == [deep, deep]


def test_both_of_a_pair_are_named_in_the_one_line(
    tmp_path: Path, fake_slurm: tuple[dict[str, str], Path]
) -> None:
    env, called = fake_slurm
    for flags, first, second in [
        (["--mem", "64G", "--mem-per-gpu", "8G"], "mem", "mem_per_gpu"),
        (["--cpus-per-task", "8", "--cpus-per-gpu", "4"], "cpus_per_task", "cpus_per_gpu"),
    ]:
        done = run_cli("submit", "--gpus-per-node", "2", *flags, cwd=tmp_path, env=env)
        _assert_refused(done, second, tmp_path, called)
        assert f"give either {first} or {second}, not both" in done.stderr
