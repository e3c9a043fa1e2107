"""Debian's packages the local cluster needs, installed with apt-get (root, no daemon started)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from clustertrain.errors import UserError

_POLICY = Path("/usr/sbin/policy-rc.d")


def install(packages: list[str]) -> None:
    """``apt-get install`` of ``packages`` (after ``apt-get update`` if the first try fails);
    its last error line as a :class:`UserError` if the second fails too. Package scripts would
    start the system's own daemons: a policy-rc.d that exits 101 forbids that meanwhile."""
    created = not _POLICY.exists()
    if created:
        _POLICY.write_text("#!/bin/sh\nexit 101\n")
        _POLICY.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    try:
        if subprocess.run(argv, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True)
            done = subprocess.run(argv, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise UserError(f"apt-get install {' '.join(packages)} failed: {last}")
    finally:
        if created:
            _POLICY.unlink()
