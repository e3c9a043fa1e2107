"""The pure core: a :class:`~clustertrain.spec.JobSpec` becomes the exact scripts Slurm runs.

``scripts`` renders the batch and launch scripts, ``container`` a container runtime's part of
them, ``templates`` the Jinja2 templates (this package's ``templates/`` folder). No I/O.
"""

from clustertrain.render.scripts import (
    OFFLINE_ENV,
    Expand,
    RenderedJob,
    launcher_argv,
    prepare_text,
    rank_environment,
    render,
    venv_environment,
)

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
