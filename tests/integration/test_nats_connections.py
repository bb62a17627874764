"""How Tandem connects to NATS, against real ``nats-server``s (issue 46 §3.5, §3.6): the inbox prefix a server's
permissions allow, TLS with a CA file and client certificates, NKEY seeds and ``.creds`` files (one server each
per module; certificates and keys are made here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from _nats import certificates, creds_text, nkey_pair, signed_jwt
from tandem.config import NatsConfig
from tandem.messaging import JetStream, StreamSpec
from tandem.messaging.nkeys import PREFIX_ACCOUNT, PREFIX_OPERATOR
from tandem.messaging.server import EmbeddedServer, start_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def prefixed_server(tmp_path_factory: pytest.TempPathFactory):
    """A server whose one user may subscribe only under ``_TANDEM_IN``."""
    config = """authorization {
  users = [{user: relay, password: pw, permissions: {publish: [">"], subscribe: ["_TANDEM_IN.>"]}}]
}
"""
    started = start_server(tmp_path_factory.mktemp("nats-inbox") / "js", config=config)
    try:
        yield started
    finally:
        started.stop()


def test_a_connection_takes_its_replies_under_the_configured_inbox_prefix(prefixed_server: EmbeddedServer) -> None:
    url = prefixed_server.url.replace("nats://", "nats://relay:pw@")
    with pytest.raises(Exception, match="Permissions Violation"):
        with JetStream(NatsConfig((url,))) as js:  # the default _INBOX: refused by the server's permissions
            js.stream_info("nothing")
    with JetStream(NatsConfig((url,), inbox_prefix="_TANDEM_IN")) as js:
        js.ensure_stream(StreamSpec("inbox_t", ("inbox.t.*",)))
        acks = js.publish([("inbox.t.0", b"one", "id-1"), ("inbox.t.0", b"two", "id-2")])
        assert [ack["seq"] for ack in acks] == [1, 2]
        assert [m for chunk in js.read("inbox_t", "inbox.t.0", 1, 2) for m in chunk] == [(1, b"one"), (2, b"two")]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory):
    """A server that requires TLS with client certificates and authenticates users by NKEY: the server, the
    certificate files and the seed files of its one user (``node``) and of a stranger."""
    folder = tmp_path_factory.mktemp("nats-tls")
    files = certificates(folder / "pki")
    seed, user = nkey_pair()
    stranger, _ = nkey_pair()
    for name, text in (("node.nk", seed), ("stranger.nk", stranger)):
        (folder / name).write_text(f"# the NKEY seed of a test user\n{text}\n")
        (folder / name).chmod(0o600)
    config = f"""tls {{
  cert_file: "{files['server']}"
  key_file: "{files['server_key']}"
  ca_file: "{files['ca']}"
  verify: true
  timeout: 2
}}
authorization {{
  users = [{{nkey: "{user}"}}]
}}
"""
    started = start_server(folder / "js", config=config, scheme="tls")
    try:
        yield started, files, folder / "node.nk", folder / "stranger.nk"
    finally:
        started.stop()


def test_tls_with_a_ca_file_a_client_certificate_and_an_nkey_user_reads_and_writes(secured) -> None:
    server, files, seed, _ = secured
    nats = NatsConfig((server.url,), tls_ca_file=str(files["ca"]), tls_cert_file=str(files["client"]),
                      tls_key_file=str(files["client_key"]), nkey_seed_file=str(seed))
    with JetStream(nats) as js:
        js.ensure_stream(StreamSpec("tls_t", ("tls.t.*",)))
        assert [ack["seq"] for ack in js.publish([("tls.t.0", b"secret", "id-1")])] == [1]
        assert [m for chunk in js.read("tls_t", "tls.t.0", 1, 1) for m in chunk] == [(1, b"secret")]


@pytest.mark.parametrize(("change", "refusal"), [
    ({"nkey_seed_file": None}, "Authorization Violation"),
    ({"stranger": True}, "Authorization Violation"),
    ({"tls_cert_file": None, "tls_key_file": None}, "certificate|closed|reset|EOF"),  # the server verifies clients
    ({"tls_ca_file": "other_ca"}, "CERTIFICATE_VERIFY_FAILED"),
])
def test_a_connection_without_what_the_server_requires_is_refused(secured, change: dict, refusal: str) -> None:
    server, files, seed, stranger = secured
    options = {"tls_ca_file": str(files["ca"]), "tls_cert_file": str(files["client"]),
               "tls_key_file": str(files["client_key"]), "nkey_seed_file": str(seed)}
    options.update({key: value for key, value in change.items() if key != "stranger"})
    if change.get("stranger"):
        options["nkey_seed_file"] = str(stranger)
    if options["tls_ca_file"] == "other_ca":
        options["tls_ca_file"] = str(files["other_ca"])
    with pytest.raises(ConnectionError, match=refusal) as refused:
        with JetStream(NatsConfig((server.url,), **options)) as js:
            js.stream_info("tls_t")
    assert "SU" not in str(refused.value), "no seed in an error"


def test_the_ca_may_come_from_ssl_cert_file_as_a_launched_driver_gets_it(
        secured, monkeypatch: pytest.MonkeyPatch) -> None:
    server, files, seed, _ = secured
    monkeypatch.setenv("SSL_CERT_FILE", str(files["ca"]))
    nats = NatsConfig((server.url,), tls_cert_file=str(files["client"]), tls_key_file=str(files["client_key"]),
                      nkey_seed_file=str(seed))
    with JetStream(nats) as js:
        assert js.stream_info("no_such_stream") is None


@pytest.fixture(scope="module")
def operated(tmp_path_factory: pytest.TempPathFactory):
    """A server in operator mode (JWTs: an operator, an account with JetStream, preloaded) and a ``.creds`` file
    of a user of that account."""
    folder = tmp_path_factory.mktemp("nats-jwt")
    operator_seed, operator = nkey_pair(PREFIX_OPERATOR)
    account_seed, account = nkey_pair(PREFIX_ACCOUNT)
    user_seed, user = nkey_pair()
    operator_jwt = signed_jwt({"sub": operator, "name": "test-operator", "nats": {"type": "operator", "version": 2}},
                              operator_seed)
    limits = {"subs": -1, "conn": -1, "leaf": -1, "imports": -1, "exports": -1, "data": -1, "payload": -1,
              "wildcards": True, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    account_jwt = signed_jwt({"sub": account, "name": "tandem", "nats": {"type": "account", "version": 2,
                                                                          "limits": limits}}, operator_seed)
    _, system = nkey_pair(PREFIX_ACCOUNT)
    system_jwt = signed_jwt({"sub": system, "name": "SYS", "nats": {"type": "account", "version": 2}}, operator_seed)
    user_jwt = signed_jwt({"sub": user, "name": "tandem-node", "nats": {
        "type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1}}, account_seed)
    (folder / "operator.jwt").write_text(operator_jwt)
    (folder / "node.creds").write_text(creds_text(user_jwt, user_seed))
    (folder / "impostor.creds").write_text(creds_text(user_jwt, nkey_pair()[0]))  # the JWT with another seed
    config = f"""operator: "{folder / 'operator.jwt'}"
system_account: {system}
resolver: MEMORY
resolver_preload: {{
  {account}: "{account_jwt}"
  {system}: "{system_jwt}"
}}
"""
    started = start_server(folder / "js", config=config)
    try:
        yield started, folder
    finally:
        started.stop()


def test_a_creds_file_signs_in_with_its_jwt(operated) -> None:
    server, folder = operated
    with JetStream(NatsConfig((server.url,), creds_file=str(folder / "node.creds"))) as js:
        js.ensure_stream(StreamSpec("jwt_t", ("jwt.t.*",)))
        assert [ack["seq"] for ack in js.publish([("jwt.t.0", b"one", None)])] == [1]
    with pytest.raises(ConnectionError, match="Authorization Violation"):
        JetStream(NatsConfig((server.url,), creds_file=str(folder / "impostor.creds")))
