"""Per-allocation read tokens.

The device plugin hands each vGPU container a token (``VGPU_TOKEN``) that lets it, and
only it, read its own allocation and usage from the node's metrics endpoint. Tokens are
HMACs over (pod UID, container index) with a per-node secret, so verification is
stateless and survives daemon restarts without a token store: the secret is the only
state, kept in a file on the host.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

_VERSION = "v1"
_SECRET_BYTES = 32


class TokenMinter:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("token secret must be at least 16 bytes")
        self._secret = secret

    def _mac(self, pod_uid: str, container_index: int) -> str:
        message = f"{_VERSION}\n{pod_uid}\n{container_index}".encode()
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def mint(self, pod_uid: str, container_index: int) -> str:
        if not pod_uid or "." in pod_uid:
            raise ValueError(f"pod UID {pod_uid!r} cannot be put in a token")
        return f"{_VERSION}.{pod_uid}.{container_index}.{self._mac(pod_uid, container_index)}"

    def verify(self, token: str | None) -> tuple[str, int] | None:
        """(pod UID, container index) when the token is genuine, else None."""
        if not token:
            return None
        parts = token.strip().split(".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[2].isdigit():
            return None
        pod_uid, index = parts[1], int(parts[2])
        if not hmac.compare_digest(parts[3], self._mac(pod_uid, index)):
            return None
        return pod_uid, index


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
