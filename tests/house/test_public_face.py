"""The rank side's public face, as a user's script sees it: ``from clustertrain import runtime``
and the rest are plain modules whose names are the rank side's very objects, and ``mypy
--strict`` reads a script that uses every documented call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import clustertrain.checkpoint
import clustertrain.env
import clustertrain.events
import clustertrain.runtime
from clustertrain.rank import checkpoint, env, events, runtime

ROOT = Path(__file__).resolve().parents[2]

# Every rank-side call the docs name (docs/your-script.md, docs/fault-tolerance.md, the examples).
USER_SCRIPT = """\
from pathlib import Path

import torch

from clustertrain import checkpoint, env, events, runtime


def train(out: Path) -> None:
    context = env.from_environ()
    stop = runtime.StopRequest.install()
    model = torch.nn.Linear(2, 1)
    runtime.time_forward(model)
    runtime.milestone("rendezvous")
    store = checkpoint.Store(out / "checkpoints")
    for step in range(3):
        with runtime.compute():
            loss = model(torch.zeros(1, 2)).sum()
        runtime.heartbeat(step)
        runtime.log_metrics(step, loss=loss.item(), lr=0.1)
        events.record("step", step=step)
        if stop.agreed():
            if context.rank == 0:
                store.save(1, {"step": step}, step=step)
                events.record("checkpoint", epoch=1, step=step)
                requeue: Path | None = runtime.request_requeue()
                print(requeue)
            break
    state = checkpoint.rng_state()
    checkpoint.restore_rng(state)
    print(env.expand_hostlist("node[1-2]"), env.rendezvous_port(42), context.world_size)
    runtime.finish(runtime.NO_RESTART_EXIT if not out.exists() else 0)
"""


def test_the_public_modules_are_the_rank_sides_objects_not_copies() -> None:
    pairs = [
        (clustertrain.runtime, runtime),
        (clustertrain.env, env),
        (clustertrain.checkpoint, checkpoint),
        (clustertrain.events, events),
    ]
    for public, real in pairs:
        assert public.__all__, public.__name__
        for name in public.__all__:
            assert getattr(public, name) is getattr(real, name), f"{public.__name__}.{name}"
        # a plain module of its own name, not another module swapped in sys.modules
        assert sys.modules[public.__name__] is public and public is not real


def _mypy(script: Path) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` on the user's ``script``, clustertrain read as an installed package is
    (typed by its ``py.typed``; its own modules' errors silent, as site-packages' are). The
    clone is named on MYPYPATH: mypy cannot see through pip's editable-install import hook."""
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    argv = [sys.executable, "-m", "mypy", "--strict", "--no-incremental"]
    argv += ["--follow-imports=silent", "--cache-dir=/dev/null", str(script)]
    return subprocess.run(
        argv, capture_output=True, text=True, cwd=script.parent, env=env, check=False
    )


def test_mypy_strict_reads_a_script_that_uses_every_documented_call(tmp_path: Path) -> None:
    assert (ROOT / "clustertrain" / "py.typed").is_file()
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    done = _mypy(script)
    assert done.returncode == 0, done.stdout + done.stderr
    # The check can fail: a name the public face does not have is reported.
    script.write_text(USER_SCRIPT + "\nruntime.no_such_call()\n")
    done = _mypy(script)
    assert done.returncode == 1 and 'has no attribute "no_such_call"' in done.stdout


# The submit side's face: ``clustertrain.Job`` and the rest are imported on first use, and a type
# checker reads them as the real objects all the same.
API_SCRIPT = """\
import clustertrain

job = clustertrain.Job.attach("last")
report = job.status()
value: float | None = report.headline.value if report.headline else None
print(job.state, job.run_dir, value, [m.get("test_acc") for m in job.metrics()])
"""


def test_mypy_strict_reads_the_python_apis_lazy_names(tmp_path: Path) -> None:
    script = tmp_path / "submit.py"
    script.write_text(API_SCRIPT)
    done = _mypy(script)
    assert done.returncode == 0, done.stdout + done.stderr
    script.write_text(API_SCRIPT + "job.run.no_such_call()\n")
    done = _mypy(script)
    assert done.returncode == 1 and 'has no attribute "no_such_call"' in done.stdout


def test_the_repos_own_scripts_and_benches_type_check_against_the_package() -> None:
    """CI's verdict on the demo (scripts/check-demo) and the benches call the package as users
    do; a call the package no longer has fails here, not at CI's end or a bench's next run."""
    argv = [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir=/dev/null"]
    argv += ["bench", "scripts/check-demo"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
