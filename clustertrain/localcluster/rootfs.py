"""A newer Slurm for the local cluster: Debian 13's Slurm 24.11 in a root filesystem made once
with mmdebstrap and cached, beside this host's own Slurm (Debian 12's 22.05, the default).

Every difference between the two that the local cluster needs is here, named by version:

- **The daemons run inside the root filesystem.** slurmctld, slurmd and the slurmstepd it
  starts re-execute their own binaries and need Debian 13's C library, so each starts in a
  mount namespace of its own that binds the host's folders a job needs (:func:`host_folders`:
  homes, /tmp, the project; the cluster's state, /proc, /sys, /dev; the host's users and the
  node's hosts file) into the root filesystem, then ``chroot``\\s there (:func:`daemon_argv`).
  Nothing is mounted in the host's own namespace, so nothing is left to unmount.
- **The clients are 24.11's too**: 24.11 refuses a 22.05 client. ``<state dir>/bin`` holds
  ``sbatch``, ``squeue``... that run the root filesystem's binaries through its own dynamic
  loader (:func:`write_clients`), for any user, root or not; ``PluginDir`` in slurm.conf names
  its plugins, at a path that means the same inside the root filesystem (a link there to ``/``).
- **cgroups**: 24.11's slurmd starts its cgroup plugin whatever the other settings say;
  ``cgroup.conf`` says ``CgroupPlugin=disabled`` (a value 22.05 does not know).

A cached root filesystem whose ``slurmctld -V`` does not say the expected version is made
again, never used (:func:`ensure`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

from clustertrain.errors import UserError

from . import apt, modules
from .layout import SLURM_DEFAULT

# version: (Debian suite, the packages the root filesystem holds). libffi8: the host's Python
# (ctypes, so torch) runs inside; iproute2 and procps: what the launch script and node check
# call; runc: srun --container.
_SUITES = {"24.11": "trixie"}
_PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "munge",
    "libffi8",
    "iproute2",
    "procps",
    "runc",
    "slurmdbd",
    "lmod",
)
# Slurm's commands, as clients on the host (and anywhere PATH leads to <state dir>/bin).
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct", "srun", "salloc", "sstat",
           "sacctmgr")  # fmt: skip
# The host's top-level folders a node does not bind: the root filesystem's own system.
_SYSTEM = {"bin", "boot", "etc", "lib", "lib32", "lib64", "libx32", "sbin", "usr", "var", "run",
           "proc", "sys", "dev", "lost+found"}  # fmt: skip
# Files of the host's /etc a node binds: its users (a job runs as its user), its names.
_ETC = ("passwd", "group", "hosts", "resolv.conf")
_BUILD_TIMEOUT_S = 900


def cache_dir() -> Path:
    return Path(os.environ.get("CLUSTERTRAIN_ROOTFS_DIR", "/var/cache/clustertrain"))


def root(version: str) -> Path:
    """Where the root filesystem of Slurm ``version`` is kept."""
    return cache_dir() / f"slurm-{version}"


# The dynamic loader of each architecture Debian builds Slurm for.
_LOADERS = {
    "x86_64-linux-gnu": "ld-linux-x86-64.so.2",
    "aarch64-linux-gnu": "ld-linux-aarch64.so.1",
}


def multiarch() -> str:
    return str(sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu")


def plugin_dir(base: Path) -> Path:
    return base / "usr" / "lib" / multiarch() / "slurm-wlm"


def slurm_conf_lines(version: str) -> list[tuple[str, str]]:
    """What slurm.conf says for Slurm ``version``: for one of a root filesystem, where its
    plugins are (the clients on the host would load this host's own otherwise)."""
    return [] if version == SLURM_DEFAULT else [("PluginDir", str(plugin_dir(root(version))))]


def cgroup_conf(version: str) -> str | None:
    """cgroup.conf for Slurm ``version``, beside slurm.conf; None: none is written."""
    if version == SLURM_DEFAULT:
        return None  # 22.05 loads no cgroup plugin with these settings, and knows no "disabled"
    return (
        "# Written by clustertrain: Slurm 24.11's slurmd starts a cgroup plugin whatever the\n"
        "# other settings say, and the nodes here have no systemd to give it a scope.\n"
        "CgroupPlugin=disabled\n"
    )


def holds(base: Path, version: str) -> bool:
    """Whether ``base`` is a root filesystem whose slurmctld is Slurm ``version``, with every
    program the cluster runs from it (an older cache may lack slurmdbd or Lmod)."""
    needed = [base / "usr" / "sbin" / name for name in ("slurmctld", "slurmd", "slurmdbd")]
    if not all(path.is_file() for path in needed) or not modules.installed(base):
        return False
    said = subprocess.run(
        ["chroot", str(base), "/usr/sbin/slurmctld", "-V"], capture_output=True, text=True,
        check=False, timeout=60,
    )  # fmt: skip
    words = said.stdout.split()  # "slurm-wlm 24.11.5"
    return said.returncode == 0 and len(words) == 2 and words[1].startswith(f"{version}.")


def ensure(version: str, bound: list[Path]) -> Path:
    """The root filesystem of Slurm ``version``, made (or made again) if the cache does not
    hold it, with a mount point for each folder in ``bound``."""
    base = root(version)
    if not holds(base, version):
        _build(base, version)
        if not holds(base, version):
            raise UserError(
                f"slurm: the root filesystem made in {base} does not run Slurm {version}; "
                f"see `chroot {base} slurmctld -V`"
            )
    _finish(base, bound)
    return base


def _build(base: Path, version: str) -> None:
    mmdebstrap = _mmdebstrap()
    fresh = base.with_name(base.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.parent.mkdir(parents=True, exist_ok=True)
    argv = [mmdebstrap, "--variant=apt", f"--include={','.join(_PACKAGES)}", _SUITES[version],
            str(fresh)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
    if done.returncode != 0:
        shutil.rmtree(fresh, ignore_errors=True)
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"slurm: mmdebstrap {_SUITES[version]} failed: {last}")
    shutil.rmtree(base, ignore_errors=True)
    fresh.rename(base)


def _mmdebstrap() -> str:
    found = shutil.which("mmdebstrap")
    if not found:
        apt.install(["mmdebstrap"])
        found = shutil.which("mmdebstrap")
    if not found:
        raise UserError("slurm: mmdebstrap is missing and apt-get could not install it")
    return found


def _finish(base: Path, bound: list[Path]) -> None:
    """Mount points for the bound folders and files, and the link that makes ``base``'s own
    path mean ``/`` inside it (PluginDir, the clients' loader: one path on both sides)."""
    for folder in {*host_folders(), *bound}:
        (base / folder.relative_to("/")).mkdir(parents=True, exist_ok=True)
    for name in _ETC:
        (base / "etc" / name).touch(exist_ok=True)
    # Where 24.11's srun --container mounts the step's spool folder (oci.conf's MountSpoolDir,
    # /var/run/slurm by default): a container of the read-only host cannot make it itself.
    (base / "run" / "slurm").mkdir(parents=True, exist_ok=True)
    inside = base / base.relative_to("/")
    if not inside.is_symlink():
        inside.parent.mkdir(parents=True, exist_ok=True)
        if inside.exists():
            shutil.rmtree(inside)
        inside.symlink_to("/")


def host_folders() -> list[Path]:
    """The host's top-level folders a node binds: everything but the system's own."""
    return sorted(
        p
        for p in Path("/").iterdir()
        if p.is_dir() and not p.is_symlink() and p.name not in _SYSTEM
    )


def daemon_argv(base: Path, bound: list[Path], argv: list[str]) -> list[str]:
    """``argv`` (a daemon of the root filesystem, in its own mount namespace already) run
    inside ``base`` with the host's folders, ``bound`` and /etc's files bound in."""
    binds = [("/proc", "proc"), ("/sys", "sys"), ("/dev", "dev")]
    binds += [(str(p), str(p.relative_to("/"))) for p in [*host_folders(), *bound]]
    binds += [(f"/etc/{name}", f"etc/{name}") for name in _ETC]
    # The root filesystem a mount of its own first: inside the chroot, "/" is then a mount
    # point, as runc (srun --container) needs to set its propagation.
    script = " && ".join(
        [f"mount --bind {shlex.quote(str(base))} {shlex.quote(str(base))}"]
        + [f"mount --rbind {shlex.quote(src)} {shlex.quote(str(base / dst))}" for src, dst in binds]
    )
    return ["sh", "-c", f'{script} && exec chroot {shlex.quote(str(base))} "$@"', "sh", *argv]


def write_clients(base: Path, bin_dir: Path) -> None:
    """``bin_dir``'s Slurm commands: the root filesystem's, through its own dynamic loader."""
    lib = base / "usr" / "lib" / multiarch()
    bin_dir.mkdir(mode=0o755, exist_ok=True)
    for name in CLIENTS:
        words = [str(lib / _LOADERS[multiarch()]), "--library-path",
                 f"{plugin_dir(base)}:{lib}", str(base / "usr" / "bin" / name)]  # fmt: skip
        script = f'#!/bin/sh\n# Slurm\'s {name} from {base}\nexec {shlex.join(words)} "$@"\n'
        path = bin_dir / name
        path.write_text(script)
        path.chmod(0o755)
