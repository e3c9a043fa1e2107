"""What the Python code Jinja2 compiles our templates into needs at run time, without Jinja2.

Jinja2 compiles a template into a module whose ``root(context)`` yields the text; that code
reaches the runtime through a few names (``missing``, ``Undefined``...), the environment's
``getattr``, ``undefined``, ``concat`` and ``filters``, and the context's ``resolve_or_missing``,
``call`` and ``eval_ctx``. This module gives exactly those, with Jinja2's meaning for templates
like ours (``StrictUndefined``, no autoescape). :func:`portable` refuses code that uses anything
else, so a template with a macro, a ``loop`` variable or a block is rendered by Jinja2 itself.

Jinja2's generated code is not a public API: tests/test_templates.py renders every template
through both and compares, and a change of its shape shows there (or makes :func:`portable`
refuse, which only costs time).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import CodeType
from typing import Any

# Part of the cache key: a change here invalidates every template compiled before it.
VERSION = "1"

# The names Jinja2's code imports from jinja2.runtime, and those the code may use.
_IMPORT = re.compile(r"\Afrom jinja2\.runtime import ([\w, ]+)\n")
_USABLE = {"missing", "Undefined", "internalcode", "TemplateRuntimeError", "str_join", "identity"}
_ENVIRONMENT = {"getattr", "undefined", "concat", "filters"}
_CONTEXT = {"resolve_or_missing", "call", "eval_ctx"}
_FILTERS = {"shquote", "join"}


class TemplateRuntimeError(Exception):
    pass


class UndefinedError(TemplateRuntimeError):
    pass


missing: Any = type("MissingType", (), {"__repr__": lambda self: "missing"})()


class Undefined:
    """``StrictUndefined``: any use of a value the template was not given is an error."""

    def __init__(
        self, hint: str | None = None, obj: Any = missing, name: str | None = None, exc: Any = None
    ) -> None:
        self._name = name

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise UndefinedError(f"{self._name!r} is undefined")

    __str__ = __iter__ = __bool__ = __len__ = __eq__ = __ne__ = __hash__ = _fail  # type: ignore
    __call__ = __getitem__ = __contains__ = __add__ = __radd__ = __lt__ = __gt__ = _fail
    __getattr__ = _fail  # type: ignore[assignment]


def internalcode(func: Callable[..., Any]) -> Callable[..., Any]:
    return func


def identity(value: Any) -> Any:
    return value


def str_join(seq: Iterable[Any]) -> str:
    return "".join(map(str, seq))


def _join(eval_ctx: Any, value: Iterable[Any], d: str = "", attribute: Any = None) -> str:
    """Jinja2's ``join`` filter, as its code calls it (with the evaluation context first)."""
    if attribute is not None:
        raise TemplateRuntimeError("join(attribute=...) is not supported here")
    return d.join(map(str, value))


class Environment:
    undefined = Undefined

    def __init__(self, filters: Mapping[str, Callable[..., Any]]) -> None:
        self.filters = {**filters, "join": _join}

    @staticmethod
    def getattr(obj: Any, attribute: str) -> Any:
        """``obj.attribute``, else ``obj[attribute]``, else undefined (as Jinja2's)."""
        try:
            return getattr(obj, attribute)
        except AttributeError:
            pass
        try:
            return obj[attribute]
        except (TypeError, LookupError):
            return Undefined(obj=obj, name=attribute)

    @staticmethod
    def concat(parts: Iterable[str]) -> str:
        return "".join(parts)


class Context:
    eval_ctx = None

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = values

    def resolve_or_missing(self, key: str) -> Any:
        return self._values.get(key, missing)

    @staticmethod
    def call(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # The code hands the loop's and block's variables along, for functions that ask for
        # the context (none of ours do); Jinja2's own call drops them the same way.
        kwargs.pop("_loop_vars", None)
        kwargs.pop("_block_vars", None)
        return func(*args, **kwargs)


def portable(python: str) -> str | None:
    """Jinja2's code for a template, made to run on this module; None if it needs more."""
    import ast  # lazy: start-up time; only compiling a template reads its code

    imported = _IMPORT.match(python)
    if imported is None:
        return None
    body = python[imported.end() :]
    names = {name.strip() for name in imported[1].split(",")}
    used: set[str] = set()
    environment: set[str] = set()
    context: set[str] = set()
    filters: set[str] = set()
    for node in ast.walk(ast.parse(body)):
        if isinstance(node, ast.Name) and node.id in names:
            used.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "environment":
                environment.add(node.attr)
            elif node.value.id == "context":
                context.add(node.attr)
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "environment.filters":
            filters.add(str(ast.literal_eval(node.slice)))
    fits = used <= _USABLE and environment <= _ENVIRONMENT and context <= _CONTEXT
    return body if fits and filters <= _FILTERS else None


def run(
    code: CodeType, values: Mapping[str, Any], filters: Mapping[str, Callable[..., Any]]
) -> str:
    """Execute a template's code (:func:`portable`, compiled) with ``values``."""
    environment = Environment(filters)
    namespace: dict[str, Any] = {
        "__name__": "clustertrain.render.compiled",
        "environment": environment,
        "missing": missing,
        "Undefined": Undefined,
        "internalcode": internalcode,
        "identity": identity,
        "str_join": str_join,
        "TemplateRuntimeError": TemplateRuntimeError,
    }
    exec(code, namespace)  # noqa: S102 - code Jinja2 compiled from our own template
    root: Callable[..., Iterator[str]] = namespace["root"]
    return "".join(root(Context(values), missing, environment))
