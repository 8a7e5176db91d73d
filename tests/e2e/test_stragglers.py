"""Stragglers end to end: DogStatsD lines with `|T` client timestamps in the past.

Within the allowed lateness they correct an emitted window (``corrections`` > 0, a higher
revision); beyond it they land in ``late_events`` and the window keeps its value until
`streamgauge replay` recomputes it from the log. At every step the store must equal the
reference windower run over the durable log.

Timeline (2 s windows, watermark_delay 1 s, allowed_lateness 6 s; now = n):

    n-40 s  e2e.late, a window final long ago          -> late_events, then replay
    ~n-4 s  e2e.c.3, its newest window published, not final -> correction (end + 6 s > W)
    n       regular traffic keeps the watermark moving
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from datadog.dogstatsd.base import DogStatsd

from streamgauge.windows.reference import ReferenceWindower
from tests.e2e.harness import (
    Daemon,
    PacedSender,
    _canonical,
    daemon_for,
    load,
    reference_rows,
    segments_from_spool,
    stored_rows,
    wait_until,
)

CONFIG = """
name: stragglers
pane: 1s
windows:
  - {name: per_2s, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 6s,
     metrics: ["e2e.*"]}
"""


@pytest.fixture()
def daemon() -> Iterator[Daemon]:
    with daemon_for(CONFIG, "stragglers") as daemon:
        yield daemon


def test_stragglers_correct_windows_or_land_in_late_events_and_replay_applies_them(
    daemon: Daemon,
) -> None:
    daemon.start()
    sender = PacedSender(daemon.port, lines_per_second=200)
    sender.start()
    wait_until(daemon, "select count(*) >= 3 as ok from window_results")
    dog = DogStatsd("127.0.0.1", daemon.port, disable_telemetry=True)
    now_s = int(time.time())
    # The straggler goes to the newest window of e2e.c.3 published and not final: it holds
    # the series already (so its new row is a correction, not a new series), and it stays
    # open for allowed_lateness past the watermark that published it.
    published = "from window_results where metric = 'e2e.c.3' and not is_final"
    wait_until(daemon, f"select count(*) >= 1 as ok {published}")
    straggler_s = int(daemon.query(
        f"select max(extract(epoch from window_start))::int8 as s {published}"
    )[0]["s"])  # fmt: skip
    dog.count_with_timestamp("e2e.c.3", 5, timestamp=straggler_s)
    dog.count_with_timestamp("e2e.late", 7, timestamp=now_s - 40)
    dog.flush()
    wait_until(daemon, "select count(*) >= 1 as ok from late_events")
    wait_until(
        daemon,
        "select coalesce(bool_or(corrections > 0), false) as ok from window_results "
        f"where metric = 'e2e.c.3' and window_start = to_timestamp({straggler_s})",
    )
    sender.stop()
    assert daemon.stop() == 0, daemon.log_tail()

    config = load(daemon.config_path)
    spool = daemon.data_dir / "spool"
    assert stored_rows(daemon, config.name) == reference_rows(config, spool)
    late = daemon.query("select metric, count, replayed_at from late_events")
    assert [(r["metric"], r["count"], r["replayed_at"]) for r in late] == [("e2e.late", 1, None)]

    out = daemon.cli(
        "replay", "--config", str(daemon.config_path), "--data-dir", str(daemon.data_dir),
        "--from", str(now_s - 120), "--to", str(now_s + 60),
    )  # fmt: skip
    assert "1 late partial(s) applied" in out

    windower = ReferenceWindower(config)
    windower.feed_all(segments_from_spool(spool))
    after = {
        (k[0], k[1], _canonical(k[2]), k[3]): (w.count, w.sum, w.is_final)
        for k, w in windower.stored(after_replay=True).items()
    }
    rows = stored_rows(daemon, config.name)
    stored = {k: (v["count"], v["sum"], v["is_final"]) for k, v in rows.items()}
    assert stored == after
    replayed = daemon.query(
        "select count(*) as n from late_events where replayed_at is not null"
    )
    assert replayed == [{"n": 1}]
    late_window = daemon.query(
        "select sum, corrections from window_results where metric = 'e2e.late'"
    )
    assert late_window == [{"sum": 7.0, "corrections": 0}]  # a new series: not a correction
