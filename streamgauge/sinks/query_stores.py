"""The result stores of one start of the window queries, closed together once they stopped.

Each streaming query's ``foreachBatch`` writers hold a ``ResultStore`` of their own (an open
connection: two queries' batches may run at once and must not share one). Spark keeps a
stopped query's writer for as long as py4j keeps its callback, so a store nobody closes keeps
its connection open long after its query is gone. The daemon restarts every query after a
failure (``daemon.RestartBudget``): without this, each restart would leave one connection
per writer behind, and a test run that starts the job often would run PostgreSQL out of
clients ("too many clients already").
"""

from __future__ import annotations

from streamgauge.sinks.store import ResultStore


class QueryStores:
    """A store factory for ``start_window_queries`` that remembers what it made.

    Call it for each new store; ``close_all`` once the queries it served have stopped.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._open: list[ResultStore] = []

    def __call__(self) -> ResultStore:
        store = ResultStore(self._url)
        self._open.append(store)
        return store

    def __len__(self) -> int:
        """How many stores are waiting to be closed."""
        return len(self._open)

    def close_all(self) -> None:
        """Close every store made so far, for good (``ResultStore.retire``): a stopped
        query's writer may still be referenced, and may still be finishing a call, which
        then fails instead of opening a connection nobody closes."""
        opened, self._open = self._open, []
        for store in opened:
            store.retire()
