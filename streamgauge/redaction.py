"""Keep credentials out of logs and terminal output (issue: credentials are never logged)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """``postgresql://user:secret@host:5432/db`` → ``postgresql://user:***@host:5432/db``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


#: Query parameters of a ``pyarrow.fs`` URI that hold secrets (S3's ``secret_key`` and
#: ``session_token``; Azure's ``account_key``, ``client_secret``, SAS ``sig``).
_SECRET_QUERY_KEYS = frozenset(
    {"secret_key", "session_token", "account_key", "client_secret", "sig", "password", "token"}
)


def redact_location(location: str) -> str:
    """A spool location fit for a log line: a URI's password (``s3://KEY:SECRET@bucket``) and
    secret query parameters (``?secret_key=…``) masked; a local path unchanged."""
    if "://" not in location:
        return location
    parts = urlsplit(redact_url(location))
    if not parts.query:
        return urlunsplit(parts)
    query = "&".join(
        f"{key}=***" if key.lower() in _SECRET_QUERY_KEYS else item
        for item in parts.query.split("&")
        for key in [item.split("=", 1)[0]]
    )
    return urlunsplit(parts._replace(query=query))


def redact_secrets_in(text: str, location: str) -> str:
    """``text`` (an error message that may quote ``location``) with the location's secrets
    masked: its password and the values of secret query parameters."""
    if "://" not in location:
        return text
    parts = urlsplit(location)
    secrets = [parts.password or ""] + [
        value
        for item in parts.query.split("&")
        for key, _, value in [item.partition("=")]
        if key.lower() in _SECRET_QUERY_KEYS
    ]
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
