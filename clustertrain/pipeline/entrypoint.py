"""Refuse a job whose entry point cannot start where it will run, before it waits in the queue:
a ``module`` the job's Python cannot import, a ``script`` that is not there.

The check runs here, with the job's virtual environment and ``env``, in its working directory:
the nodes see the same paths (the runs dir, the venv and the working directory are on shared
filesystems at a site, and on this very host in the local cluster). A job in a container is
not checked: its image has its own Python and files. ``--no-preflight`` skips the check, for a
module that only the nodes can import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from clustertrain.errors import UserError
from clustertrain.spec import JobSpec

from . import prepare

SKIP = " (or skip this check with --no-preflight)"
# Finding a module imports its parent packages, as `python -m` will: a package whose
# __init__ imports torch takes seconds, one that hangs is said to.
TIMEOUT_S = 120
# Run by the job's own Python; it prints why a module cannot be found, and exits 3.
_PROBE = """\
import importlib.util, sys
try:
    found = importlib.util.find_spec(sys.argv[1]) is not None
    why = "No module named " + repr(sys.argv[1])
except BaseException as exc:
    found, why = False, (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]
if not found:
    print(why)
    sys.exit(3)
"""


def check(spec: JobSpec, workdir: str) -> None:
    """Raise :class:`UserError` when ``spec``'s script or module cannot start in ``workdir``."""
    if spec.container_image is not None:
        return
    if spec.script is not None:
        if not Path(workdir, spec.script).is_file():
            raise UserError(
                f"script: {spec.script} is not a file in {workdir}, where the job runs; give "
                f"its path from there, or submit from the folder that holds it{SKIP}"
            )
        return
    assert spec.module is not None
    env = prepare.environment(spec, os.environ)
    python = python_of(spec, env)
    try:
        done = subprocess.run(
            [python, "-c", _PROBE, spec.module], cwd=workdir, env=env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise UserError(
            f"module: importing {spec.module}'s packages with {python} in {workdir} took over "
            f"{TIMEOUT_S} s; look at what their __init__.py do{SKIP}"
        ) from None
    except OSError as exc:
        raise UserError(
            f"venv: cannot run {python} ({exc.strerror}); check the job's venv{SKIP}"
        ) from None
    if done.returncode != 0:
        why = done.stdout.strip() or done.stderr.strip() or f"exit {done.returncode}"
        raise UserError(
            f"module: {spec.module} cannot be imported where the job runs ({python} in "
            f"{workdir}): {why.splitlines()[-1][:300]}; install it into the job's venv, or "
            f"submit from the folder that holds it{SKIP}"
        )


def python_of(spec: JobSpec, env: dict[str, str]) -> str:
    """The Python the job's launcher runs: its venv's, else the first on its PATH."""
    if spec.venv:
        return str(Path(spec.venv, "bin", "python"))
    return shutil.which("python3", path=env.get("PATH")) or sys.executable
