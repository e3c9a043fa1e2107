"""Your settings: the files of yours that clustertrain reads on the submit side, in one folder
(``config_dir``), each read through one bounded, owner-checked reader (``read_setting``).

  hosts.py       your login nodes (``hosts.yaml``): which clustertrain each one runs
  noderecord.py  the nodes your runs found bad, per cluster (``nodes/<cluster>.json``)
  site.py        what every job on a cluster needs, per cluster (``sites.yaml``)

The local test cluster's own configuration is not a setting of yours: it is
``clustertrain.localcluster``. Per cluster means per slurm.conf ``ClusterName``
(:func:`cluster_name`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, read_own, read_regular

# Moves the whole folder (tests, a second identity); else the XDG rule.
ENV_CONFIG_DIR = "CLUSTERTRAIN_CONFIG_DIR"
CLUSTER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def config_dir() -> Path:
    """Where your settings live: ``$CLUSTERTRAIN_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/
    clustertrain``, else ``~/.config/clustertrain`` (the XDG Base Directory rules: an unset or
    empty variable, or a relative path, is no choice)."""
    if named := os.environ.get(ENV_CONFIG_DIR):
        return Path(named)
    xdg = os.environ.get("XDG_CONFIG_HOME") or ""
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".config"
    return base / "clustertrain"


def read_setting(path: Path, limit: int, what: str) -> bytes:
    """The whole of your settings file ``path`` (at most ``limit`` bytes): a regular file that
    only you can have written, in a folder that only you can write (a teammate's file, or one
    in a shared folder, could otherwise choose what runs on your login node). Anything else is a
    :class:`UserError` naming ``what`` it is and the fix."""
    try:
        return read_own(path, limit)
    except RunFolderError as error:
        raise UserError(
            f"{what}: {error}; keep it a file of yours alone (chmod go-w, owned by you)"
        ) from None


def cluster_name(environ: Mapping[str, str] | None = None) -> str | None:
    """The ``ClusterName`` of the slurm.conf that Slurm's commands here read (``$SLURM_CONF``,
    else Slurm's default file), or None where there is none to read (a laptop; a configless
    site's login node) or it names none: a file read, no daemon asked."""
    env = os.environ if environ is None else environ
    conf = Path(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        text = read_regular(conf, 1 << 20).decode("utf-8", "replace")
    except (RunFolderError, OSError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip().lower() == "clustername" and CLUSTER_NAME.fullmatch(value.strip()):
            return value.strip()
    return None
