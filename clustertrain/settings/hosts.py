"""Your settings for the login nodes you reach with ``--host``: one YAML file, by default
``~/.config/clustertrain/hosts.yaml`` (``$XDG_CONFIG_HOME`` moves it; ``$CLUSTERTRAIN_HOSTS_FILE``
names another)::

    login:                      # a destination of your ~/.ssh/config
      remote_clustertrain: /shared/venvs/ct/bin/clustertrain

Which clustertrain runs on a host (:func:`clustertrain_for`): ``--remote-clustertrain PATH``
(the Python API's ``remote_clustertrain=``), then ``$CLUSTERTRAIN_REMOTE_CLUSTERTRAIN``, then
this file's entry for the host, then ``clustertrain`` on the login shell's PATH.

The file is yours alone (clustertrain.settings.read_setting), parsed like a job file
(clustertrain.spec.jobfile: no aliases, no duplicate keys) and checked whole, every host's
entry, before anything reaches a host.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from clustertrain.backends.remote import ssh
from clustertrain.errors import FieldError
from clustertrain.spec import jobfile

from . import config_dir, read_setting

DEFAULT_CLUSTERTRAIN = "clustertrain"
ENV_CLUSTERTRAIN = "CLUSTERTRAIN_REMOTE_CLUSTERTRAIN"
ENV_HOSTS_FILE = "CLUSTERTRAIN_HOSTS_FILE"
CLUSTERTRAIN = "remote_clustertrain"  # the setting, named like the flag and the API's argument
SETTINGS = (CLUSTERTRAIN,)
_EXAMPLE = "like `login: {remote_clustertrain: /opt/venv/bin/clustertrain}`"


def hosts_file() -> tuple[Path, bool]:
    """The file, and whether the user named it (then it must exist)."""
    if named := os.environ.get(ENV_HOSTS_FILE):
        return Path(named), True
    return config_dir() / "hosts.yaml", False


def read() -> dict[str, dict[str, str]]:
    """Every host's settings; {} without a file. Raises FieldError naming what is wrong."""
    path, named = hosts_file()
    if not path.exists():
        if named:
            raise FieldError(
                ENV_HOSTS_FILE, str(path), "no such file; name your hosts file, or unset it"
            )
        return {}
    data = jobfile.parse(
        read_setting(path, jobfile.MAX_BYTES, "hosts file"), str(path), "hosts file"
    )
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FieldError("hosts file", str(path), f"must map host names to settings, {_EXAMPLE}")
    return {_host(path, host): _entry(path, host, entry) for host, entry in data.items()}


def _host(path: Path, host: Any) -> str:
    if isinstance(host, str):
        try:
            return ssh.check_host(host)
        except FieldError as error:
            raise FieldError(f"{path}: host", host, error.valid) from None
    raise FieldError(f"{path}: host", host, f"must be a host name, {_EXAMPLE}")


def _entry(path: Path, host: str, entry: Any) -> dict[str, str]:
    if not isinstance(entry, dict):
        raise FieldError(f"{path}: {host}", entry, f"must be a mapping of settings, {_EXAMPLE}")
    for key in entry:
        if key not in SETTINGS:
            raise FieldError(
                f"{path}: {host}.{key}", entry[key], f"not a host setting; the one is {SETTINGS[0]}"
            )
    return {key: str(ssh.check_program(f"{path}: {host}.{key}", v)) for key, v in entry.items()}


def clustertrain_for(host: str, given: str | None = None) -> str:
    """The clustertrain to run on ``host``: ``given`` (a flag's value), the environment's, the
    hosts file's, or the default; checked, with the hosts file, before any ssh."""
    settings = read().get(ssh.check_host(host), {})
    # An empty variable is no choice; an empty flag is a bad one.
    chosen = given if given is not None else os.environ.get(ENV_CLUSTERTRAIN) or None
    if chosen is not None:
        return ssh.check_program(CLUSTERTRAIN, chosen)
    return settings.get(CLUSTERTRAIN, DEFAULT_CLUSTERTRAIN)
