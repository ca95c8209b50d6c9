"""kubeadm bootstrap tokens, as kube-apiserver and kube-controller-manager handle them.

A token ``<id>.<secret>`` (``[a-z0-9]{6}.[a-z0-9]{16}``) lives in the Secret
``kube-system/bootstrap-token-<id>`` of type ``bootstrap.kubernetes.io/token``. The
authenticator accepts it while it has ``usage-bootstrap-authentication: true`` and has not
expired (user ``system:bootstrap:<id>``, groups ``system:bootstrappers`` plus
``auth-extra-groups``). The controllers' part runs in :func:`sync`: the token cleaner deletes
expired tokens and the bootstrap signer keeps ``kube-public/cluster-info`` carrying one
``jws-kubeconfig-<id>`` detached JWS (HS256, keyed by the token secret, ``kid`` the token id)
of its ``kubeconfig`` per valid signing token, which is what ``kubeadm join`` verifies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
SECRET_TYPE = "bootstrap.kubernetes.io/token"
SECRET_PREFIX = "bootstrap-token-"
JWS_PREFIX = "jws-kubeconfig-"
BOOTSTRAPPERS = "system:bootstrappers"


@dataclass(frozen=True)
class BootstrapToken:
    token_id: str
    secret: str
    expiration: datetime | None
    authentication: bool
    signing: bool
    extra_groups: tuple[str, ...]

    def expired(self, now: datetime | None = None) -> bool:
        return self.expiration is not None and self.expiration <= (now or datetime.now(UTC))


def _b64(data: dict[str, Any], key: str) -> str:
    raw = data.get(key)
    if not isinstance(raw, str):
        return ""
    try:
        return base64.b64decode(raw).decode()
    except ValueError:
        return ""


def from_secret(secret: dict[str, Any]) -> BootstrapToken | None:
    """The token a Secret holds, or None if it is not a well-formed bootstrap token."""
    if secret.get("type") != SECRET_TYPE:
        return None
    data = secret.get("data") or {}
    token_id, token_secret = _b64(data, "token-id"), _b64(data, "token-secret")
    name = (secret.get("metadata") or {}).get("name", "")
    if name != SECRET_PREFIX + token_id or not TOKEN_RE.match(f"{token_id}.{token_secret}"):
        return None
    expiration = None
    if _b64(data, "expiration"):
        try:
            expiration = datetime.fromisoformat(_b64(data, "expiration").replace("Z", "+00:00"))
        except ValueError:
            # The token cleaner treats an unparsable expiration as expired.
            expiration = datetime.fromtimestamp(0, UTC)
    groups = tuple(g for g in _b64(data, "auth-extra-groups").split(",") if g)
    return BootstrapToken(token_id, token_secret, expiration,
                          _b64(data, "usage-bootstrap-authentication") == "true",
                          _b64(data, "usage-bootstrap-signing") == "true", groups)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def detached_jws(content: str, token_id: str, token_secret: str) -> str:
    """RFC 7515 appendix F: a compact JWS with the payload left out (``header..signature``)."""
    header = _b64url(json.dumps({"alg": "HS256", "kid": token_id},
                                separators=(",", ":")).encode())
    payload = _b64url(content.encode())
    signature = hmac.new(token_secret.encode(), f"{header}.{payload}".encode(),
                         hashlib.sha256).digest()
    return f"{header}..{_b64url(signature)}"


def cluster_info_data(kubeconfig: str, tokens: list[BootstrapToken],
                      now: datetime | None = None) -> dict[str, str]:
    """What the bootstrap signer makes cluster-info's data: the kubeconfig plus a signature
    per valid signing token."""
    data = {"kubeconfig": kubeconfig}
    for token in tokens:
        if token.signing and not token.expired(now):
            data[JWS_PREFIX + token.token_id] = detached_jws(kubeconfig, token.token_id,
                                                             token.secret)
    return dict(sorted(data.items()))
