"""Connection strings and command lines in messages and logs, without their secrets.

Below configuration and storage alike (both show URLs in their errors); imports nothing of Tandem.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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


MASK = "***"
"""What a log shows in place of a secret."""
SECRET_NAME = re.compile(r"pass(word|wd|phrase)|secret|token|credential|authori[sz]ation|jaas|"
                         r"(api|access|private|secret)[-_.]?key", re.IGNORECASE)
"""A setting, flag or URL parameter whose name says its value is a secret (``spark.ssl.keyStorePassword``,
``spark.authenticate.secret``, ``fs.s3a.secret.key``, ``--token``, ``;token=``)."""
_SETTING = re.compile(r"^(?P<name>-{0,2}[A-Za-z_][-\w.]*)=(?P<value>.*)$", re.DOTALL)
_USER_INFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^/?#@\s]*)@")
_QUERY = re.compile(r"(?P<url>[A-Za-z][A-Za-z0-9+.-]*://[^\s?#]*)\?[^\s#]*")
_PARAMETER = re.compile(r";(?P<name>[^;=\s]+)=(?P<value>[^;\s]*)")


def _without_user_secret(match: re.Match) -> str:
    user, colon, _ = match["info"].partition(":")
    return match["scheme"] + (f"{user}@" if user and colon else "")


def redact_text(text: str) -> str:
    """``text`` with the secrets of the URLs in it left out, as :func:`redact_url` leaves them out: a user's password
    (the user name stays), a token given as the user info alone, the query; and a secret ``;name=value``
    parameter (Spark Connect's ``;token=``) masked."""
    text = _USER_INFO.sub(_without_user_secret, text)
    text = _QUERY.sub(lambda m: f"{m['url']}?{MASK}", text)
    return _PARAMETER.sub(lambda m: f";{m['name']}={MASK}" if SECRET_NAME.search(m["name"]) else m[0], text)


def redact_command(argv: Sequence[str]) -> list[str]:
    """A command line (``spark-submit …``) as a log may show it: the value of a secret setting (``name=value``,
    e.g. after ``--conf``) or of a secret flag (``--token value``) masked, and every URL without its secrets
    (:func:`redact_text`). A new list; ``argv`` is left as it is."""
    shown: list[str] = []
    for index, argument in enumerate(argv):
        flag = argv[index - 1] if index else ""
        setting = _SETTING.match(argument)
        if flag.startswith("-") and "=" not in flag and SECRET_NAME.search(flag):
            shown.append(MASK)
        elif setting and SECRET_NAME.search(setting["name"]):
            shown.append(f"{setting['name']}={MASK}")
        else:
            shown.append(redact_text(argument))
    return shown
