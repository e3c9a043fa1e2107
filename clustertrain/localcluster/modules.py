"""Environment modules on the local cluster's nodes, as sites load CUDA, NCCL and Python:
Debian's Lmod, on this host (Slurm 22.05's nodes share its files) and in the root filesystem
of another Slurm (rootfs.py installs it there too).

A job reaches it as a site's user does, with its own setup lines (``setup: [module use DIR,
module load NAME]``); the batch script makes the ``module`` command first where the shell it
runs in has none (clustertrain's templates: the system's profile script for it).
"""

from __future__ import annotations

from pathlib import Path

PACKAGES = ["lmod"]
# What a shell sources to have `module` (Debian's package puts it here).
PROFILE = Path("/etc/profile.d/lmod.sh")


def installed(root: Path = Path("/")) -> bool:
    return (root / PROFILE.relative_to("/")).is_file()
