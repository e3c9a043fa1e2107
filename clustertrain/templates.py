"""The one Jinja2 environment for every file clustertrain renders (job scripts, slurm.conf).

Templates hold layout only: values arrive already validated, and every value that lands in a
shell script goes through the ``shquote`` filter.
"""

from __future__ import annotations

import shlex
from functools import cache
from importlib.resources import files
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
    return files("clustertrain._templates").joinpath(name).read_text(encoding="utf-8")


def render_template(name: str, **context: Any) -> str:
    return environment().get_template(name).render(**context)
