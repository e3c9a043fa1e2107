"""A notebook's call, pickled for the ranks (:func:`pack`): cloudpickle, the notebook's own
functions by value, an installed module's by name; each object that cannot be pickled, or the
largest when the call is too large, named as a user would look for it."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from clustertrain.errors import FieldError, UserError
from clustertrain.rank import notebook as rank_side


def pack(fn: Callable[..., Any], args: Sequence[Any], key: bytes, max_bytes: int) -> bytes:
    """The call as the ranks read it, or a :class:`UserError` naming the object that cannot
    be pickled, or the largest one when the call is over ``max_bytes``."""
    import cloudpickle  # lazy: start-up time (a dry run needs no pickling)

    if not callable(fn):
        raise FieldError("fn", fn, "give the function each rank calls: notebook_launcher(f, args)")
    if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn):
        raise FieldError(
            "fn", fn, "a generator or coroutine cannot come back from the ranks; return a list"
        )
    if not isinstance(args, tuple | list):
        raise FieldError("args", args, "a tuple of fn's arguments, e.g. (config,)")
    try:
        data: bytes = cloudpickle.dumps({"fn": fn, "args": tuple(args), "key": key})
    except Exception as exc:
        where, why = next(_unpicklable(fn, args), ("the call", rank_side.error_line(exc)))
        raise UserError(
            f"{where} cannot be pickled ({why}); create it inside the function (open files "
            "there), or pass what makes it (a path, a seed) instead"
        ) from None
    if len(data) > max_bytes:
        where, size = max(_sizes(fn, args), key=lambda pair: pair[1], default=("the call", 0))
        raise UserError(
            f"the call is {_mib(len(data))} pickled, over max_bytes ({_mib(max_bytes)}); "
            f"{where} is {_mib(size)} of it: load large data inside the function (from a file "
            "the nodes read), or raise max_bytes"
        )
    return data


def _parts(fn: Callable[..., Any], args: Sequence[Any]) -> Iterator[tuple[str, Any]]:
    """What a pickled call holds, each named as a user would look for it: the arguments, and
    what the function carries with it (its closure's variables, the globals it uses, its
    defaults, a method's object)."""
    for at, arg in enumerate(args):
        yield f"args[{at}]", arg
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if hasattr(fn, "__self__") and not inspect.ismodule(fn.__self__):
        yield f"the object of {name}", fn.__self__
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    for var, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (), strict=False):
        yield f"{var} (a variable of {name}'s closure)", _content(cell)
    seen, used = getattr(fn, "__globals__", {}), _names(code)
    for var in used:
        if var in seen and not inspect.ismodule(seen[var]):
            yield f"{var} (a global {name} uses)", seen[var]
    for at, default in enumerate(getattr(fn, "__defaults__", None) or ()):
        yield f"default {at} of {name}", default


def _names(code: Any) -> list[str]:
    """The global names a code object and those nested in it (comprehensions, inner
    functions) load, in order, once each."""
    found = dict.fromkeys(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            found.update(dict.fromkeys(_names(const)))
    return list(found)


def _content(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a variable not yet assigned
        return None


def _unpicklable(fn: Callable[..., Any], args: Sequence[Any]) -> Iterator[tuple[str, str]]:
    import cloudpickle  # lazy: start-up time, as in pack

    for where, part in _parts(fn, args):
        try:
            cloudpickle.dumps(part)
        except Exception as exc:
            yield where, rank_side.error_line(exc)


def _sizes(fn: Callable[..., Any], args: Sequence[Any]) -> Iterator[tuple[str, int]]:
    import cloudpickle  # lazy: start-up time, as in pack

    for where, part in _parts(fn, args):
        yield where, len(cloudpickle.dumps(part))


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"
