"""The Jinja2 environment for every file clustertrain renders: the job scripts (this package's
``templates/``) and the local cluster's configuration (``clustertrain/cluster/templates/``).

Templates hold layout only: values arrive already validated, and every value that lands in a
shell script goes through the ``shquote`` filter.
"""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

# The job scripts' templates: files beside this module, in the installed package.
JOB_TEMPLATES = Path(__file__).with_name("templates")


@cache
def environment(folder: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    return env


def render_template(name: str, folder: Path = JOB_TEMPLATES, **context: Any) -> str:
    return environment(folder).get_template(name).render(**context)
