"""Containers: the launcher and its ranks run in an image; the batch shell stays on the host.

pyxis (``srun --container-image``) and Slurm's own OCI support (``srun --container BUNDLE``)
put a whole srun step in the container; Apptainer is a command that prefixes the step's. Either
way the batch script's signal trap, requeue and node check run on the host: requeue needs no
Slurm inside the image, and the signal srun sends the step reaches every rank (they are
processes of the step like any other).

Every runtime mounts the run folder and the working directory at the same paths, then the
job's ``container_mounts``. Pure functions: the renderer calls them, and a submission writes
the OCI bundle (:data:`BUNDLE_DIR`) that :func:`oci_config` describes.
"""

from __future__ import annotations

import json
import os
from pathlib import PurePosixPath
from typing import NamedTuple

from clustertrain.spec import JobSpec

# The run folder's OCI bundle: config.json and an empty rootfs/ that the image is mounted on
# (Slurm 22.05 ignores a bundle's root.path and always runs BUNDLE/rootfs).
BUNDLE_DIR = "container"
BUNDLE_ROOTFS = "rootfs"
# What Apptainer is called; the same command line works for SingularityCE's `singularity`.
APPTAINER = "apptainer"
# The node's name resolution, mounted over the image's: the rendezvous resolves names as the
# host does, and the rendezvous store names its peers through the node's name server (without
# it, every rank warns that it cannot, as it did on the local cluster's nodes).
NODE_FILES = ("/etc/hosts", "/etc/resolv.conf")
# The PATH an OCI process starts with (Slurm appends the job's environment to it).
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Mount(NamedTuple):
    source: str
    destination: str
    read_only: bool

    def text(self) -> str:
        """pyxis's and Apptainer's ``SRC:DST[:ro]``."""
        return f"{self.source}:{self.destination}" + (":ro" if self.read_only else "")


def mounts(spec: JobSpec, run_dir: str, workdir: str) -> tuple[Mount, ...]:
    """The working directory and the run folder at their own paths (one only where the other
    holds it), then the job's ``container_mounts`` in order."""
    work, run = PurePosixPath(workdir), PurePosixPath(run_dir)
    if run.is_relative_to(work):
        own = [workdir]
    elif work.is_relative_to(run):
        own = [run_dir]
    else:
        own = [workdir, run_dir]
    return (*(Mount(path, path, False) for path in own), *user_mounts(spec))


def user_mounts(spec: JobSpec) -> tuple[Mount, ...]:
    """The job's ``container_mounts``: ``SRC[:DST][:ro|rw]``, DST defaulting to SRC."""
    found = []
    for text in spec.container_mounts:
        source, _, rest = text.partition(":")
        destination, _, mode = rest.partition(":")
        if destination in ("ro", "rw") and not mode:
            destination, mode = "", destination
        found.append(Mount(source, destination or source, mode == "ro"))
    return tuple(found)


def missing_mount_points(spec: JobSpec, run_dir: str, workdir: str, image: str) -> list[str]:
    """The folders an OCI job mounts on that ``image`` (a root filesystem here) lacks. The
    image is mounted read-only, so runc cannot create them; under /tmp (a fresh tmpfs) it can.
    The one function here that reads files."""

    wanted = [*NODE_FILES, *(m.destination for m in mounts(spec, run_dir, workdir))]
    return [
        path
        for path in wanted
        if not PurePosixPath(path).is_relative_to("/tmp")
        and not os.path.lexists(os.path.join(image, path.lstrip("/")))
    ]


def bundle_path(run_dir: str) -> str:
    return str(PurePosixPath(run_dir, BUNDLE_DIR))


def srun_options(spec: JobSpec, run_dir: str, workdir: str) -> tuple[str, ...]:
    """The flags that put the launch step in the container (pyxis, oci); none for Apptainer."""
    if spec.container_runtime == "pyxis":
        return (
            f"--container-image={spec.container_image}",
            "--container-mounts=" + ",".join(m.text() for m in mounts(spec, run_dir, workdir)),
            f"--container-workdir={workdir}",
        )
    if spec.container_runtime == "oci":
        return (f"--container={bundle_path(run_dir)}",)
    return ()


def command_prefix(spec: JobSpec, run_dir: str, workdir: str) -> tuple[str, ...]:
    """What precedes the launch script on the step's command line (Apptainer only). ``--nv``
    only where there are GPUs: without a driver it warns on every node."""
    if spec.container_runtime != "apptainer" or spec.container_image is None:
        return ()
    return (
        APPTAINER,
        "exec",
        *(("--nv",) if spec.gpus_per_node else ()),
        "--bind",
        ",".join(m.text() for m in mounts(spec, run_dir, workdir)),
        "--pwd",
        workdir,
        spec.container_image,
    )


def oci_config(spec: JobSpec, run_dir: str, workdir: str) -> str | None:
    """The run's OCI bundle configuration (``config.json``), or None for other runtimes.

    The image's root filesystem is bind-mounted read-only on the bundle's empty rootfs, so
    jobs share one image and none can change it. No network, UTS or PID namespace: the ranks
    see the node's addresses, hostname, /etc/hosts and /etc/resolv.conf (the rendezvous
    resolves names as the host does) and are plain processes of the step, which Slurm signals.
    The node's /dev/shm replaces runc's 64 MB default, which NCCL and DataLoader workers outgrow.
    """
    if spec.container_runtime != "oci" or spec.container_image is None:
        return None
    # The image first: everything else is mounted on top of it.
    image = _bind("/", spec.container_image, "rbind", "ro")
    node = [
        _bind("/dev/shm", "/dev/shm", "rbind"),
        _bind("/sys", "/sys", "rbind", "ro"),
        *(_bind(path, path, "bind", "ro") for path in NODE_FILES),
    ]
    job = [
        _bind(m.destination, m.source, "rbind", "ro" if m.read_only else "rw")
        for m in mounts(spec, run_dir, workdir)
    ]
    config = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/false"],  # Slurm puts the step's command here
            "env": [f"PATH={_DEFAULT_PATH}"],
            "cwd": workdir,
            "capabilities": {kind: _CAPABILITIES for kind in _CAPABILITY_SETS},
            "noNewPrivileges": True,
        },
        "root": {"path": BUNDLE_ROOTFS, "readonly": True},
        "mounts": [image, *_KERNEL_MOUNTS, *node, *job],
        "linux": {"namespaces": [{"type": "mount"}]},
    }
    return json.dumps(config, indent=2) + "\n"


def _bind(destination: str, source: str, *options: str) -> dict[str, object]:
    return {"destination": destination, "type": "bind", "source": source, "options": list(options)}


# runc spec's defaults: what an unprivileged process in a container keeps.
_CAPABILITIES = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
_CAPABILITY_SETS = ("bounding", "effective", "permitted", "ambient")
_KERNEL_MOUNTS: list[dict[str, object]] = [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {
        "destination": "/dev",
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
    },
    {
        "destination": "/dev/pts",
        "type": "devpts",
        "source": "devpts",
        "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
    },
    {
        "destination": "/dev/mqueue",
        "type": "mqueue",
        "source": "mqueue",
        "options": ["nosuid", "noexec", "nodev"],
    },
    {
        "destination": "/tmp",
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", "mode=1777"],
    },
]
