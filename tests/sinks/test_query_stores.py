"""QueryStores: the stores made for one start of the window queries close together."""

from __future__ import annotations

from typing import cast

import pytest

from streamgauge.sinks.query_stores import QueryStores
from streamgauge.sinks.store import run_sql


def _store_backends(url: str) -> set[int]:
    """Backend pids of the server's open ``ResultStore`` connections."""
    _, rows = run_sql(
        url, "SELECT pid FROM pg_stat_activity WHERE application_name = 'streamgauge'"
    )
    pids = cast(list[tuple[int]], rows)  # pid: integer
    return {int(row[0]) for row in pids}


def test_close_all_closes_every_store_it_made_and_the_next_start_gets_new_ones(
    clean_store: str,
) -> None:
    stores = QueryStores(clean_store)
    before = _store_backends(clean_store)
    first = [stores() for _ in range(3)]  # one per writer of a start
    for store in first:
        assert store.read_state("any", "watermark") is None  # connects
    opened = _store_backends(clean_store) - before
    assert len(opened) == 3 and len(stores) == 3

    stores.close_all()  # the queries stopped (a restart, or the daemon's stop)
    assert not _store_backends(clean_store) & opened
    assert len(stores) == 0
    # A stopped query's release watcher finishing a call opens no connection left behind.
    with pytest.raises(RuntimeError, match="retired"):
        first[0].read_state("any", "watermark")
    assert not _store_backends(clean_store) - before

    again = stores()  # the restarted queries' writers
    assert again.read_state("any", "watermark") is None
    assert len(_store_backends(clean_store) - before - opened) == 1
    stores.close_all()
    assert _store_backends(clean_store) <= before
