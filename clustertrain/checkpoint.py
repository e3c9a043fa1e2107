"""``clustertrain.checkpoint``, as training scripts import it (``from clustertrain import
checkpoint``): checkpoints that survive a kill at any moment (``Store``; Accelerate's
``save_state`` folders).

The code is :mod:`clustertrain.rank.checkpoint`, the rank side's; these are its public names,
the very objects, re-exported from that one real module so that type checkers see them.
"""

from clustertrain.rank.checkpoint import (
    KEEP,
    Store,
    gather,
    latest_accelerator_state,
    restore_rng,
    rng_state,
    save_accelerator_state,
)

__all__ = [
    "KEEP",
    "Store",
    "gather",
    "latest_accelerator_state",
    "restore_rng",
    "rng_state",
    "save_accelerator_state",
]
