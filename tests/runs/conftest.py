"""The follower's two ways of learning of new lines, for tests to run in both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clustertrain.runs import follow_mode, inotify


def _no_inotify(said: str) -> None:
    pytest.fail(f"inotify is missing on this Linux test host: {said}")


@pytest.fixture(params=[follow_mode.POLL, follow_mode.INOTIFY])
def watcher(request: pytest.FixtureRequest) -> Iterator[inotify.Watcher | None]:
    """None (the follower polls), or an inotify watcher of its own."""
    if request.param == follow_mode.POLL:
        yield None
        return
    opened = inotify.Watcher.open(_no_inotify)
    assert opened is not None
    yield opened
    opened.close()


@pytest.fixture(params=[follow_mode.POLL, follow_mode.INOTIFY])
def follow_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``$CLUSTERTRAIN_FOLLOW`` set to each mode in turn."""
    monkeypatch.setenv(follow_mode.ENV_FOLLOW, request.param)
    return str(request.param)
