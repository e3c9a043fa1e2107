"""The one Jinja2 environment for every file clustertrain renders (job scripts, slurm.conf).

Templates hold layout only: values arrive already validated, and every value that lands in a
shell script goes through the ``shquote`` filter.
"""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jinja2


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    return env


def _load(name: str) -> str:
    # The package's folder, without importlib.resources: that import alone costs ~13 ms, a tenth
    # of the dry run's budget. The templates are plain files in the installed package.
    import importlib

    folder = importlib.import_module("clustertrain._templates").__path__[0]
    return Path(folder, name).read_text(encoding="utf-8")


def render_template(name: str, **context: Any) -> str:
    return environment().get_template(name).render(**context)
