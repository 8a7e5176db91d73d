"""One SparkSession for the whole test run (cold start costs seconds; DESIGN.md §9)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from streamgauge.windows.session import build_spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_spark_session("local[2]", app_name="streamgauge-tests", shuffle_partitions=2)
    yield session
    session.stop()
