"""Progress of long work (``streamgauge replay``), on stderr while it runs.

Every ``interval_s`` the line says the elapsed time and which of the config's windows the work
is on, with the windows done / to do and, once one is done, the time left at the pace so far
(``window``: replay tells it as each window's turn comes). On a terminal the line is redrawn
in place; otherwise it is printed every ``plain_every_s``, so a log file gets a line, not a
flood.
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

from streamgauge.operator.terminal import Terminal, duration


class WindowProgress(threading.Thread):
    """Draws ``what``'s progress through a config's windows until ``stop``."""

    def __init__(
        self, what: str, stream: TextIO, *, interval_s: float = 1.0, plain_every_s: float = 10.0,
    ) -> None:  # fmt: skip
        super().__init__(name="window-progress", daemon=True)
        self._what = what
        self._terminal = Terminal(stream, live=stream.isatty())
        self._interval_s = interval_s if self._terminal.live else plain_every_s
        self._halt = threading.Event()
        self._began = time.monotonic()
        self._window: tuple[int, int, str, float] | None = None  # index, of, name, began

    def window(self, index: int, of: int, name: str) -> None:
        """The work is on window ``index`` (from 0) of ``of``, ``name``, from now on."""
        self._window = (index, of, name, time.monotonic())

    def run(self) -> None:
        while not self._halt.wait(self._interval_s):
            self._terminal.status(self.describe())

    def describe(self) -> str:
        now = time.monotonic()
        parts = [f"{self._what}: {duration((now - self._began) * 1000)}"]
        if self._window is None:
            parts.append("starting")
        else:
            index, of, name, began = self._window
            text = f"window {index + 1}/{of} {name}"
            if index:  # the windows done so far set the pace of those left
                left = (began - self._began) / index * (of - index) - (now - began)
                text += f", about {duration(max(left, 0.0) * 1000)} left"
            parts.append(text)
        return " | ".join(parts)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self._terminal.clear_status()
