"""Rendering the Jinja2 templates of ``templates/`` (installed as ``clustertrain.templates``):
the job scripts (``slurm/``) and the local cluster's configuration (``cluster/``).

Templates hold layout only: values arrive already validated, every value that lands in a shell
script goes through the ``shquote`` filter, and ``StrictUndefined`` makes a missing value an
error, never an empty string. Jinja2 is imported at the first render only (about 26 ms), so
commands that render nothing do not pay for it.
"""

from __future__ import annotations

import shlex
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2

# A folder on disk both in a wheel and in a clone's editable install (pyproject.toml maps it).
TEMPLATES = Path(str(files("clustertrain.templates")))
JOB_TEMPLATES = TEMPLATES / "slurm"
CLUSTER_TEMPLATES = TEMPLATES / "cluster"
FILTERS = {"shquote": lambda value: shlex.quote(str(value))}


def render_template(name: str, folder: Path = JOB_TEMPLATES, **context: Any) -> str:
    return environment(folder).get_template(name).render(**context)


@cache
def environment(folder: Path) -> jinja2.Environment:
    import jinja2  # lazy: start-up time

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(FILTERS)
    return env
