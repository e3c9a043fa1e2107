"""``clustertrain doctor --host``: ssh, the login node's clustertrain against this one, then its
own doctor."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from clustertrain.version import __version__

from . import ssh
from .record import REMOTE_RUNS


def doctor(host: str, clustertrain: str, echo: Callable[[str], None] = print) -> int:
    """ssh, the login node's clustertrain against this one, then its own doctor (sbatch, the
    partitions); the exit status of the whole."""
    done = ssh.run(host, [clustertrain, "--version"], timeout=60, limit=4096, what="its version")
    there = done.stdout.decode("utf-8", "replace").strip().rpartition(" ")[2]
    echo(f"ssh {host}: reached; clustertrain there: {there or 'no answer'}, here: {__version__}")
    status = subprocess.run(
        ssh.argv(
            host, [clustertrain, "doctor"], raw=f'CLUSTERTRAIN_RUNS_DIR="$HOME"/{REMOTE_RUNS} '
        ),
        check=False,
    ).returncode
    if there != __version__:
        echo(f"  - clustertrain {there or '?'} on {host} is not this one's {__version__}: "
             "install the same version there")  # fmt: skip
        return 1
    return status
