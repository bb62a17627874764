"""NATS NKEYs: a user's seed signs the server's nonce when it connects (ed25519, with ``cryptography``).

Purpose
    A NATS server can authenticate a user by an NKEY (``authorization { users = [{nkey: U...}] }``) or by a
    user JWT with its seed (a ``.creds`` file, from an operator's account): the client proves it holds the
    seed by signing the nonce of the server's ``INFO``; the seed itself never crosses the network.

How it works
    An NKEY is base32 (no padding) of a prefix byte (its role: ``U`` user, ``A`` account, ``O`` operator,
    ``S`` seed), the 32-byte key and a CRC-16 (XMODEM, little-endian) of both. A seed's first two bytes hold
    the seed prefix and the role of its public key. The ed25519 private key is the seed's 32 bytes; the
    public key is the user's name (``U...``); the signature goes in ``CONNECT`` as base64 (URL-safe, no
    padding), with ``nkey`` (the public key) or ``jwt`` (a ``.creds`` file's JWT).

What it does not do
    It makes no JWTs (an operator's tooling does; the tests build theirs) and keeps no secret in memory longer
    than a signature takes: the file is read at each connection.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

PREFIX_SEED = 18 << 3
PREFIX_USER = 20 << 3
PREFIX_ACCOUNT = 0
PREFIX_OPERATOR = 14 << 3
_CREDS_BLOCK = re.compile(r"-{3,}[^\n]*BEGIN[^\n]*-{3,}\s*\n\s*([^\s-][^\n]*?)\s*\n\s*-{3,}[^\n]*END[^\n]*-{3,}")


class NkeyError(ValueError):
    """A seed, key or ``.creds`` file that is not what it should be (the message never holds the secret)."""


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM (polynomial 0x1021, initial 0), as NKEYs check their bytes."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        crc &= 0xFFFF
    return crc


def _encode(raw: bytes) -> str:
    return base64.b32encode(raw + crc16(raw).to_bytes(2, "little")).decode().rstrip("=")


def _decode(text: str) -> bytes:
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        raise NkeyError("not base32") from None
    if len(raw) < 4 or crc16(raw[:-2]) != int.from_bytes(raw[-2:], "little"):
        raise NkeyError("its checksum does not match")
    return raw[:-2]


def encode_public(prefix: int, key: bytes) -> str:
    """The text of a public key of role ``prefix`` (``PREFIX_USER`` ...)."""
    return _encode(bytes([prefix]) + key)


def encode_seed(prefix: int, seed: bytes) -> str:
    """The text of the seed of a key of role ``prefix`` (``SU...`` for a user)."""
    return _encode(bytes([PREFIX_SEED | (prefix >> 5), (prefix & 31) << 3]) + seed)


class KeyPair:
    """The key of a seed: signs, and names its public key."""

    def __init__(self, seed: str) -> None:
        raw = _decode(seed.strip())
        if len(raw) != 34 or raw[0] & 0xF8 != PREFIX_SEED:
            raise NkeyError("not an NKEY seed (S...)")
        self.prefix = ((raw[0] & 7) << 5) | ((raw[1] & 0xF8) >> 3)
        self._private = Ed25519PrivateKey.from_private_bytes(raw[2:])

    @property
    def public_key(self) -> str:
        return encode_public(self.prefix, self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    def sign_nonce(self, nonce: str) -> str:
        """The ``sig`` of ``CONNECT``: the nonce signed, base64 URL-safe without padding."""
        return base64.urlsafe_b64encode(self.sign(nonce.encode())).decode().rstrip("=")


def read_seed_file(path: str | Path) -> KeyPair:
    """The key of an NKEY seed file (the seed on a line of its own; ``#`` comments and blank lines are skipped)."""
    lines = [line.strip() for line in Path(path).read_text().splitlines()]
    seeds = [line for line in lines if line and not line.startswith(("#", "//")) and line.startswith("S")]
    if not seeds:
        raise NkeyError(f"{path}: no NKEY seed (a line S...)")
    try:
        return KeyPair(seeds[0])
    except NkeyError as exc:
        raise NkeyError(f"{path}: the seed is not valid: {exc}") from None


def read_creds_file(path: str | Path) -> tuple[str, KeyPair]:
    """``(user JWT, key of its seed)`` of a ``.creds`` file (``-----BEGIN NATS USER JWT-----`` ... and
    ``-----BEGIN USER NKEY SEED-----`` ...)."""
    blocks = _CREDS_BLOCK.findall(Path(path).read_text())
    if len(blocks) < 2:
        raise NkeyError(f"{path}: not a .creds file (a JWT block and a seed block)")
    try:
        return blocks[0], KeyPair(blocks[1])
    except NkeyError as exc:
        raise NkeyError(f"{path}: the seed is not valid: {exc}") from None
