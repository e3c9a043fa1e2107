"""``clustertrain.env``, as training scripts import it (``from clustertrain import env``): the
distributed context of one process, read once (torchrun's variables, else Slurm's, else one
process), and the process group started from it.

The code is :mod:`clustertrain.rank.env`, the rank side's; these are its public names, the very
objects, re-exported from that one real module so that type checkers see them.
"""

from clustertrain.rank.env import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_RENDEZVOUS_TIMEOUT_S,
    DistEnv,
    RendezvousError,
    backend_for,
    destroy_process_group,
    expand_hostlist,
    from_environ,
    init_process_group,
    pick_device,
    rendezvous_port,
)

__all__ = [
    "DEFAULT_COLLECTIVE_TIMEOUT_S",
    "DEFAULT_RENDEZVOUS_TIMEOUT_S",
    "DistEnv",
    "RendezvousError",
    "backend_for",
    "destroy_process_group",
    "expand_hostlist",
    "from_environ",
    "init_process_group",
    "pick_device",
    "rendezvous_port",
]
