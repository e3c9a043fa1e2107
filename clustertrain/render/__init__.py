"""The pure core: a :class:`~clustertrain.spec.JobSpec` becomes the exact scripts Slurm runs.

``scripts`` renders the batch and launch scripts from ``commands`` (what srun and the launchers
run) and ``environment`` (what the ranks are given), ``container`` a container runtime's part of
them, ``origins`` the dry run's account of where each value came from, ``templates`` the Jinja2
templates (the repository's top-level ``templates/``, installed as ``clustertrain.templates``).
No I/O but reading the templates.
"""

from clustertrain.render.commands import Expand, launcher_argv
from clustertrain.render.environment import OFFLINE_ENV, rank_environment, venv_environment
from clustertrain.render.scripts import RenderedJob, prepare_text, render

__all__ = [
    "OFFLINE_ENV",
    "Expand",
    "RenderedJob",
    "launcher_argv",
    "prepare_text",
    "rank_environment",
    "render",
    "venv_environment",
]
