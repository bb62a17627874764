"""Connection strings in messages and logs, without their secrets.

Below configuration and storage alike (both show URLs in their errors); imports nothing of Tandem.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg2
import psycopg2.extensions


def redact(url: str) -> str:
    """The connection string without its password, for messages and logs.

    libpq's own parser reads it (URL or ``key=value`` form, ``?password=``, percent-escapes), so
    whatever libpq would send as a password is what is left out. A string libpq cannot parse is not
    shown at all.
    """
    try:
        params = psycopg2.extensions.parse_dsn(url)
    except psycopg2.Error:
        return "<a PostgreSQL URL that libpq cannot parse>"
    user = f"{params['user']}@" if params.get("user") else ""
    host = params.get("host", "")
    host = f"[{host}]" if ":" in host and "," not in host else host
    port = f":{params['port']}" if params.get("port") else ""
    return f"postgresql://{user}{host}{port}/{params.get('dbname', '')}"


def redact_url(url: str) -> str:
    """A server URL (``nats://``, ``http://``) without the secrets of its user info or query: a password, or a
    token given as the user info alone (``nats://s3cr3t@host``), is left out; the user name stays."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<a URL that cannot be parsed>"
    user = f"{parts.username}@" if parts.username and parts.password is not None else ""
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else (parts.hostname or "")
    return urlunsplit((parts.scheme, f"{user}{host}{port}", parts.path, "", ""))
