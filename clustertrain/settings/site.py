"""Your site's defaults: what every job on a cluster needs, said once. One YAML file beside your
hosts file, ``~/.config/clustertrain/sites.yaml`` (``$XDG_CONFIG_HOME`` moves it), an entry
per cluster::

    della:                      # the cluster's name: slurm.conf's ClusterName
      partition: gpu
      account: proj-123
      setup: [module load cudatoolkit/12.1, source /home/me/venvs/train/bin/activate]
      node_setup: [ulimit -n 65536]
      cpus_per_gpu: 8
      mem_per_gpu: 32G

Which entry applies (:func:`site_name`): ``$CLUSTERTRAIN_SITE`` if set, else the ``ClusterName``
of the slurm.conf that Slurm's commands here read (a file read, no daemon asked); none where
neither names one. A job file and flags win over it; its setup lines run first, then the job's
(clustertrain.spec.build); its per-GPU values serve only jobs with GPUs. A submission with
``--host`` is planned by the login node's clustertrain, which reads its own file there.

The file is yours alone (clustertrain.settings.read_setting: no symlink, nobody else's, not
writable by others, at most 256 KiB), parsed like a job file (clustertrain.spec.jobfile) and
checked whole, every entry by the fields' own checks, before any job uses it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustertrain.errors import FieldError
from clustertrain.spec import VALIDATORS, jobfile

from . import CLUSTER_NAME, cluster_name, config_dir, read_setting

SITES_FILE = "sites.yaml"
ENV_SITE = "CLUSTERTRAIN_SITE"
MAX_BYTES = 256 << 10
# What a site's defaults may hold: what every job there needs, none of one job's own choices.
FIELDS = (
    "partition", "account", "qos", "constraint", "setup", "node_setup", "cpus_per_gpu",
    "mem_per_gpu",
)  # fmt: skip
_EXAMPLE = "like `della: {partition: gpu, cpus_per_gpu: 8}`"


@dataclass(frozen=True)
class Site:
    """One cluster's defaults, checked, and the file they came from."""

    name: str
    path: Path
    values: Mapping[str, Any]

    @property
    def label(self) -> str:
        """How the dry run names them."""
        return f"site defaults: {self.name}"


def sites_file() -> Path:
    return config_dir() / SITES_FILE


def site_name(environ: Mapping[str, str] | None = None) -> str | None:
    """The cluster whose entry applies: ``$CLUSTERTRAIN_SITE`` (an empty one is no choice),
    else slurm.conf's ``ClusterName``, else None."""
    env = os.environ if environ is None else environ
    named = env.get(ENV_SITE) or None
    if named is not None and not CLUSTER_NAME.fullmatch(named):
        raise FieldError(
            ENV_SITE, named, "must be a cluster's name like della (letters, digits, _.-)"
        )
    return named or cluster_name(env)


def defaults(environ: Mapping[str, str] | None = None) -> Site | None:
    """This cluster's entry of your sites file, or None (no file, no entry, no cluster name).
    Without a file, no slurm.conf is read: a dry run pays a stat."""
    path = sites_file()
    if not os.path.lexists(path):  # a symlink, even a dangling one, is read, and refused
        return None
    name = site_name(environ)
    if name is None:
        return None
    entry = read(path).get(name)
    return None if entry is None else Site(name, path, entry)


def read(path: Path) -> dict[str, dict[str, Any]]:
    """Every entry of the file, checked. Raises FieldError naming what is wrong."""
    data = jobfile.parse(read_setting(path, MAX_BYTES, "sites file"), str(path), "sites file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FieldError("sites file", str(path), f"must map cluster names to defaults, {_EXAMPLE}")
    return {_name(path, name): _entry(path, name, entry) for name, entry in data.items()}


def _name(path: Path, name: Any) -> str:
    if not isinstance(name, str) or not CLUSTER_NAME.fullmatch(name):
        raise FieldError(
            f"{path}: cluster",
            name,
            f"must be a cluster's name (slurm.conf's ClusterName), {_EXAMPLE}",
        )
    return name


def _entry(path: Path, name: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise FieldError(f"{path}: {name}", entry, f"must be a mapping of fields, {_EXAMPLE}")
    checked = {}
    for key, value in entry.items():
        where = f"{path}: {name}.{key}"
        if key not in FIELDS:
            raise FieldError(where, value, "not a site default; those are " + ", ".join(FIELDS))
        if value is None:
            raise FieldError(where, value, "give it a value, or leave the field out")
        try:
            checked[key] = VALIDATORS[key](key, value)
        except FieldError as error:
            raise FieldError(f"{path}: {name}.{error.field}", error.value, error.valid) from None
    return checked
