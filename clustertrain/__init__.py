"""clustertrain: take a PyTorch training script from one GPU to many Slurm nodes.

``clustertrain.submit(...)`` and ``clustertrain.Job`` are the Python API (:mod:`clustertrain.api`)
and ``clustertrain.notebook_launcher(fn, args)`` a notebook's call (:mod:`clustertrain.notebook`);
they are imported on first use, so a rank importing ``clustertrain.runtime`` pays nothing for them.
"""

from typing import TYPE_CHECKING, Any

from clustertrain.version import __version__ as __version__

if TYPE_CHECKING:  # what a type checker reads; at run time, __getattr__ below imports them
    from clustertrain.api import Job as Job
    from clustertrain.api import plan as plan
    from clustertrain.api import submit as submit
    from clustertrain.notebook import notebook_launcher as notebook_launcher

__all__ = ["Job", "notebook_launcher", "plan", "submit"]


def __getattr__(name: str) -> Any:
    if name == "notebook_launcher":
        from clustertrain import notebook

        return notebook.notebook_launcher
    if name in __all__:
        from clustertrain import api

        return getattr(api, name)
    raise AttributeError(f"module 'clustertrain' has no attribute {name!r}")
