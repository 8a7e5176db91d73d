"""A thread that lets a holding writer publish closed windows between its batches.

A tumbling window's windows close when a segment's heartbeat moves the watermark past their
end. Spark's micro-batches only look at the log when one starts, so a segment written while
a batch runs waited for it to end before its windows were published: up to a whole batch,
~0.7 s on average at 100k series (issue #4, README "What p50 ≤ 1 s at 100k series would take
here"). This thread asks the writer a few times a second
(``HoldingBatchWriter.release_before_next_batch``), which publishes them as soon as the log
shows that no row to come can change them.

It is only an earlier path to the same rows: the batch that takes the segment would publish
them otherwise, at the same revision. So a failed attempt is logged and left to the batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05
"""How often the log is looked at: one listing of the spool's streams and a lookup of each
stream's next segment, while a batch's planning looks every trigger (0.5 s)."""


class ReleaseWatcher:
    """Calls ``release`` every ``interval_s`` while ``is_active()`` (the query runs); a
    daemon thread that ends with its query."""

    def __init__(
        self,
        name: str,
        release: Callable[[], int],
        is_active: Callable[[], bool],
        interval_s: float = POLL_INTERVAL_S,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        """``on_stop``: called once the query is found stopped (a prepared release rolled
        back)."""
        self._on_stop = on_stop
        self._name = name
        self._release = release
        self._is_active = is_active
        self._interval_s = interval_s
        self._thread = threading.Thread(
            target=self._run, name=f"release-watch {name}", daemon=True
        )

    def start(self) -> ReleaseWatcher:
        self._thread.start()
        return self

    def _still_active(self) -> bool:
        try:
            return self._is_active()
        except Exception:  # the JVM is gone: so is the query
            return False

    def _run(self) -> None:
        try:
            self._poll()
        finally:
            if self._on_stop is not None:
                self._on_stop()

    def _poll(self) -> None:
        failed_before = False
        while True:
            time.sleep(self._interval_s)
            if not self._still_active():
                return
            try:
                self._release()
                failed_before = False
            except Exception:  # the batch publishes the windows instead: never fatal
                if not self._still_active():
                    return  # stopped under it (its store closed): nothing to tell
                # Once per run of failures: a store that is down fails every poll.
                if not failed_before:
                    log.warning("%s: publishing closed windows between batches failed; "
                                "their batch will", self._name, exc_info=True)  # fmt: skip
                failed_before = True
