"""Rendering the Jinja2 templates: the job scripts (this package's ``templates/``) and the local
cluster's configuration (``clustertrain/cluster/templates/``), compiled once.

Templates hold layout only: values arrive already validated, and every value that lands in a
shell script goes through the ``shquote`` filter; ``StrictUndefined`` makes a missing value an
error, never an empty string.

Importing Jinja2 costs about 26 ms, a third of what a dry run may take (bench/dryrun.py), and
parsing a template a dozen more. So each template is compiled by Jinja2 once, the first time it
is rendered after an install or an edit, into Python code that is kept in the cache
(``$XDG_CACHE_HOME/clustertrain/templates``, beside the template's text it was made from, used
only for that very text and this interpreter);
later renders run that code with :mod:`clustertrain.render.jinja_runtime`, the few runtime
names such code uses, and never import Jinja2. Code that needs more than those (a macro, a
``loop`` variable) is not cached: it renders through Jinja2 itself. tests/test_templates.py
renders every template both ways and compares.
"""

from __future__ import annotations

import marshal
import os
import shlex
import sys
from functools import cache
from pathlib import Path
from types import CodeType
from typing import TYPE_CHECKING, Any

from clustertrain.render import jinja_runtime

if TYPE_CHECKING:
    import jinja2

# The job scripts' templates: files beside this module, in the installed package.
JOB_TEMPLATES = Path(__file__).with_name("templates")
FILTERS = {"shquote": lambda value: shlex.quote(str(value))}


def render_template(name: str, folder: Path = JOB_TEMPLATES, **context: Any) -> str:
    source = (folder / name).read_text(encoding="utf-8")
    code = _compiled(name, source, folder)
    if code is None:
        return render_with_jinja(name, folder, **context)
    return jinja_runtime.run(code, context, FILTERS)


def render_with_jinja(name: str, folder: Path = JOB_TEMPLATES, **context: Any) -> str:
    """The same text, rendered by Jinja2 itself: what a template the stand-in cannot run gets,
    and what the tests compare with."""
    return environment(folder).get_template(name).render(**context)


@cache
def environment(folder: Path) -> jinja2.Environment:
    import jinja2  # lazy: start-up time; only a first render, or a template the cache refuses

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


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base, "clustertrain", "templates")


def _compiled(name: str, source: str, folder: Path) -> CodeType | None:
    """The template's code: from the cache, else compiled now and kept there. None when the
    code needs more than the stand-in runtime has (then Jinja2 renders it).

    The cache file holds the template's text with its code and is used only for that very
    text: comparing it costs less than hashing it (hashlib alone takes 2 ms to import)."""
    folder_key = str(folder.resolve()).replace("/", "%")
    path = cache_dir() / f"{folder_key}%{name}.{sys.implementation.cache_tag}.code"
    try:
        kept = marshal.loads(path.read_bytes())
        if kept[:2] == (jinja_runtime.VERSION, source) and isinstance(kept[2], CodeType):
            return kept[2]  # type: ignore[no-any-return]
    except (OSError, EOFError, ValueError, TypeError, IndexError):
        pass
    python = environment(folder).compile(source, name=name, raw=True)
    body = jinja_runtime.portable(python)
    if body is None:
        return None
    code = compile(body, f"<template {name}>", "exec")
    _keep(path, marshal.dumps((jinja_runtime.VERSION, source, code)))
    return code


def _keep(path: Path, data: bytes) -> None:
    """Write the cache file whole or not at all; a cache that cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass
