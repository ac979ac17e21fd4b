"""Per-allocation read tokens.

The device plugin hands each vGPU container a token (``VGPU_TOKEN``) that lets it, and
only it, read its own allocation and usage from the node's metrics endpoint. A token is
an HMAC, with a per-node secret, over a random allocation id made for that one Allocate
answer; it says nothing about which pod it is for. kubelet's Allocate does not name the
pod either, so the device plugin only learns who holds an answer from kubelet's
checkpoint, and then writes the answer's id into that pod's allocation record. The
metrics server finds the caller by that id in the records, never by a pod named in the
environment. Verification stays stateless (the secret is the only state, kept in a file
on the host); a record holds only the id, so reading a pod's annotations does not give
its token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

_VERSION = "v2"
_SECRET_BYTES = 32
_ID_BYTES = 16  # 128 random bits


def new_allocation_id() -> str:
    """A fresh allocation id (URL-safe: letters, digits, '-' and '_')."""
    return secrets.token_urlsafe(_ID_BYTES)


class TokenMinter:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("token secret must be at least 16 bytes")
        self._secret = secret

    def _mac(self, subject: str) -> str:
        digest = hmac.new(self._secret, f"{_VERSION}\n{subject}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def mint(self, subject: str) -> str:
        """The token for one allocation id."""
        if not subject or not subject.isascii() or not all(ch.isalnum() or ch in "-_" for ch in subject):
            raise ValueError(f"{subject!r} cannot be put in a token (letters, digits, '-' and '_' only)")
        return f"{_VERSION}.{subject}.{self._mac(subject)}"

    def verify(self, token: str | None) -> str | None:
        """The allocation id when the token is genuine, else None."""
        if not token:
            return None
        parts = token.strip().split(".")
        if len(parts) != 3 or parts[0] != _VERSION or not parts[1]:
            return None
        # bytes: compare_digest refuses non-ASCII str, and a header can carry anything
        if not hmac.compare_digest(parts[2].encode(), self._mac(parts[1]).encode()):
            return None
        return parts[1]


def load_or_create_secret(path: str) -> bytes:
    """The node's token secret, created (mode 0600) on first use.

    Creation is atomic (O_EXCL), so two daemons racing at start agree on one secret.
    """
    try:
        with open(path, "rb") as handle:
            secret = handle.read()
        if len(secret) >= 16:
            return secret
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    secret = secrets.token_bytes(_SECRET_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with open(path, "rb") as handle:
            existing = handle.read()
        if len(existing) >= 16:
            return existing
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(secret)
    return secret
