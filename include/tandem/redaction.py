"""Connection strings in messages and logs, without their secrets.

Below configuration and storage alike (both show URLs in their errors); imports nothing of Tandem.
"""

from __future__ import annotations

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
