"""Values are data: whatever a user types ends up literal in the job, or is refused.

Rendered scripts run for real under bash, with stub ``srun``/``scontrol``/``torchrun``/
``accelerate`` that record the argv and environment they receive.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clustertrain.errors import FieldError
from clustertrain.render import render
from tests.conftest import job_spec

PAYLOADS = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "'; touch PWNED; '",
    '"; touch PWNED; "',
    "&& touch PWNED",
    "a b  c",
    "\\",
    "'",
    '"',
    "$HOME",
    "${IFS}",
    "\n touch PWNED",
    "naïve ☃ 日本",
    "-",
    "--",
    "*",
    "~",
    "!!",
    "$((1+1))",
    "%j %N",
]
TEXT = st.one_of(
    st.sampled_from(PAYLOADS),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30),
    st.lists(st.sampled_from(PAYLOADS)).map("".join),
)

STUB_RECORDER = """#!{python}
import json, os, sys
with open(os.environ["STUB_OUT"], "w", encoding="utf-8") as out:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, out)
"""


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stubs")
    scripts = {
        "scontrol": "#!/bin/bash\necho node1\n",
        # Like srun, drop its own options and run the command on "the node".
        "srun": '#!/bin/bash\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n',
        # The batch script's supervisor runs for real (the node check, which reads no user
        # value, is off: it needs the nodes).
        "python": f'#!/bin/sh\nexec {sys.executable} "$@"\n',
        "torchrun": STUB_RECORDER.format(python=sys.executable),
        "accelerate": STUB_RECORDER.format(python=sys.executable),
    }
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return folder


def _run_job(spec_kwargs: dict[str, object], sandbox: Path, stubs: Path) -> dict[str, object]:
    job = render(
        job_spec(**{"node_check": False, **spec_kwargs}), str(sandbox / "run"), str(sandbox)
    )
    (sandbox / "run").mkdir()
    Path(job.batch_path).write_text(job.batch_script, encoding="utf-8")
    Path(job.launch_path).write_text(job.launch_script, encoding="utf-8")
    Path(job.plan_path).write_text(job.plan, encoding="utf-8")
    record = sandbox / "record.json"
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "STUB_OUT": str(record),
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_NODEID": "0",
        "HOME": str(sandbox),
        "SLURMD_NODENAME": "node1",
    }
    done = subprocess.run(
        ["bash", job.batch_path], cwd=sandbox, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    recorded: dict[str, object] = json.loads(record.read_text(encoding="utf-8"))
    assert sorted(os.listdir(sandbox)) == ["record.json", "run"], "something extra ran"
    return recorded


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    args=st.lists(TEXT, max_size=4),
    env_value=TEXT,
    launcher=st.sampled_from(["torchrun", "accelerate"]),
)
def test_training_args_and_env_values_arrive_literally(
    args: list[str],
    env_value: str,
    launcher: str,
    stubs: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    sandbox = tmp_path_factory.mktemp("sandbox")
    recorded = _run_job(
        {"args": args, "env": {"USER_VALUE": env_value}, "launcher": launcher, "nodes": 2},
        sandbox,
        stubs,
    )
    argv = recorded["argv"]
    assert isinstance(argv, list) and argv[-len(args) - 2 :] == ["-m", "jobs.mnist.train", *args]
    env = recorded["env"]
    assert isinstance(env, dict) and env["USER_VALUE"] == env_value
    assert env["HEAD_NODE"] == "node1" and env["RDZV_PORT"] == str(29500 + 7)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from(
        [
            "name",
            "partition",
            "account",
            "qos",
            "constraint",
            "mem",
            "mail_user",
            "dependency",
            "script",
        ]
    ),
    value=TEXT,
)
def test_slurm_fields_are_refused_or_inert(
    field: str, value: str, stubs: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    try:
        job_spec(**{field: value})
    except FieldError as refused:
        assert "\n" not in str(refused)
        return
    sandbox = tmp_path_factory.mktemp("sandbox")
    recorded = _run_job({field: value}, sandbox, stubs)
    if field == "script":
        assert isinstance(recorded["argv"], list) and recorded["argv"][-1] == value
