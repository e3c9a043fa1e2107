"""Where jobs run, behind one interface (``base.Backend``), one module or package each:

  base.py    the interface: check, submit, record, state, cancel, logs, accounting, node_command
  slurm/     a Slurm cluster, through its commands: every Slurm fact, sacct's parsing included
  local.py   this machine, without Slurm, into the same run-folder layout
  remote/    a login node's clustertrain over OpenSSH, with a snapshot of the code

A backend is registered here by name, the name a run folder records (job.json's ``backend``);
its module is imported when a run of it is first asked about. A run queued through a login node
holds that login node's record (``remote.json``) beside the job.json the login node wrote: its
backend is the remote one, whatever that job.json says.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from clustertrain import protocol

if TYPE_CHECKING:
    from clustertrain.backends.base import Backend
    from clustertrain.runs import Run

# name: (module, class). A new backend is a module and a line here.
BACKENDS = {
    "slurm": ("clustertrain.backends.slurm", "SlurmBackend"),
    "local": ("clustertrain.backends.local", "LocalBackend"),
    "ssh": ("clustertrain.backends.remote", "RemoteBackend"),
}
# The backends a job is queued with by name alone; the remote one is made for a login node and
# its request (clustertrain.api.login_backend).
BY_NAME = ("slurm", "local")


def _class(name: str) -> type[Backend]:
    module, cls = BACKENDS[name]
    found: type[Backend] = getattr(importlib.import_module(module), cls)
    return found


def named(name: str) -> Backend:
    """A backend by its registered name, with its defaults (Slurm: this environment's)."""
    return _class(name)()


def for_run(run: Run) -> Backend:
    """The backend that answers for ``run``: the login node's where its folder holds a login
    node's record (it was queued with a host), else the one its job.json records."""
    remote = (run.path / protocol.REMOTE_FILE).exists()
    return _class("ssh" if remote else run.backend).for_run(run)
