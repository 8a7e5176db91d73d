"""ReleaseWatcher: the thread that lets a holding writer publish between its batches."""

from __future__ import annotations

import logging
import threading

import pytest

from streamgauge.windows.release_watch import ReleaseWatcher


def test_it_calls_release_while_the_query_runs_and_a_failure_only_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failing call is left to the batch (logged once per run of failures); the thread
    ends by itself once the query is no longer active."""
    calls: list[int] = []
    done = threading.Event()

    def release() -> int:
        calls.append(1)
        if len(calls) in (2, 3):
            raise OSError("the store is down")
        return 0

    def is_active() -> bool:
        if len(calls) >= 6:
            done.set()
            return False
        return True

    with caplog.at_level(logging.WARNING, logger="streamgauge.windows.release_watch"):
        watcher = ReleaseWatcher("q", release, is_active, interval_s=0.01).start()
        assert done.wait(5)
        watcher._thread.join(5)
    assert len(calls) == 6
    failures = [r for r in caplog.records if "between batches failed" in r.getMessage()]
    assert len(failures) == 1 and "the store is down" in (failures[0].exc_text or "")


def test_a_failure_after_the_query_stopped_ends_it_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call that fails because its query stopped under it (the store retired) says
    nothing: it is no fault."""
    active = threading.Event()
    active.set()
    ended = threading.Event()

    def release() -> int:
        active.clear()
        raise RuntimeError("the result store of x was retired")

    def is_active() -> bool:
        if not active.is_set():
            ended.set()
        return active.is_set()

    with caplog.at_level(logging.WARNING, logger="streamgauge.windows.release_watch"):
        watcher = ReleaseWatcher("q", release, is_active, interval_s=0.01).start()
        assert ended.wait(5)
        watcher._thread.join(5)
    assert not caplog.records


def test_once_the_query_stopped_it_calls_on_stop_once() -> None:
    """``on_stop`` (the writer's ``abort_prepared``) runs once the thread finds the query
    stopped: a prepared release must not outlive its query."""
    calls: list[str] = []
    stopped = threading.Event()

    def release() -> int:
        calls.append("release")
        return 0

    def on_stop() -> None:
        calls.append("stop")
        stopped.set()

    watcher = ReleaseWatcher("q", release, lambda: len(calls) < 3, interval_s=0.01,
                             on_stop=on_stop).start()  # fmt: skip
    assert stopped.wait(5)
    watcher._thread.join(5)
    assert calls == ["release", "release", "release", "stop"]
