"""A real multi-node Slurm cluster on this one machine, for trying and testing clustertrain.

Every node is a ``slurmd -N nodeK``, by default in network and UTS namespaces of its own on a
private bridge (``--layout loopback``: on 127.0.0.1 with its own port); one ``slurmctld`` and a
private ``munged`` (own key, socket and pid file in the state dir) serve them, and on the bridge
a ``dnsmasq`` answers the nodes' name lookups (reverse ones too, as a site's DNS does), and a
login node of its own runs an OpenSSH server that this machine reaches as ``ssh login``; no
systemd. Why each setting: the comments beside it in ``slurm_conf.py`` and
``templates/cluster/slurm.conf.j2``.

  layout.py     the cluster's shape, its addresses, and where its files live
  slurm_conf.py slurm.conf, gres.conf, the hosts files, dnsmasq.conf and the nodes'
                resolv.conf, rendered as text
  netns.py      the nodes' namespaces, bridge and links: made, entered, removed
  daemons.py    the daemons' command lines; started and stopped by PID and start time
  login.py      the login node: sshd's keys and configuration, ~/.ssh/config's Include line
  lifecycle.py  up, down and status; Slurm is asked through clustertrain.backends.slurm
  faults.py     a node failed (killed, its link cut) or made slow (tbf, a CPU quota), healed
  rootfs.py     Slurm 24.11 beside this host's 22.05: Debian 13's, from a root filesystem
  apt.py        the Debian packages it needs, installed without starting their daemons
  accounting.py slurmdbd on MariaDB (sacct, as sites have it), or none (--no-accounting)
  readiness.py  each daemon ready before the next starts; every node idle before up returns
  control.py    the control plane failed and started again: slurmctld, slurmdbd
  modules.py    environment modules (Debian's Lmod) on the nodes, as sites load CUDA
"""

from __future__ import annotations

from .control import SERVICES, add_user
from .control import restart as restart_service
from .control import start as start_service
from .control import stop as stop_service
from .faults import degrade, heal
from .faults import fail as fail_node
from .layout import SLURM_DEFAULT, SLURM_VERSIONS, Layout, clients_dir, default_state_dir
from .lifecycle import current_layout, down, local_slurm_conf, status, up
from .slurm_conf import (
    hosts_with_block,
    hosts_without_block,
    render_dns_conf,
    render_gres_conf,
    render_node_hosts,
    render_node_resolv,
    render_slurm_conf,
)

__all__ = [
    "SERVICES",
    "SLURM_DEFAULT",
    "SLURM_VERSIONS",
    "Layout",
    "add_user",
    "clients_dir",
    "current_layout",
    "default_state_dir",
    "degrade",
    "down",
    "fail_node",
    "heal",
    "hosts_with_block",
    "hosts_without_block",
    "local_slurm_conf",
    "render_dns_conf",
    "render_gres_conf",
    "render_node_hosts",
    "render_node_resolv",
    "render_slurm_conf",
    "restart_service",
    "start_service",
    "status",
    "stop_service",
    "up",
]
