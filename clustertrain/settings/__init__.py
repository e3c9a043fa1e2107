"""Your settings: the files of yours that clustertrain reads on the submit side, in one folder
(``config_dir``), each read through one bounded, owner-checked reader (``read_setting``).

  hosts.py       your login nodes (``hosts.yaml``): which clustertrain each one runs
  noderecord.py  the nodes your runs found bad, per cluster (``nodes/<cluster>.json``)

Site defaults, when they come, are a module here beside them. The local test cluster's own
configuration is not a setting of yours: it is ``clustertrain.localcluster``.
"""

from __future__ import annotations

import os
from pathlib import Path

from clustertrain.errors import UserError
from clustertrain.files import RunFolderError, read_own

# Moves the whole folder (tests, a second identity); else the XDG rule.
ENV_CONFIG_DIR = "CLUSTERTRAIN_CONFIG_DIR"


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
