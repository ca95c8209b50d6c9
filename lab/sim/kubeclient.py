#!/usr/bin/env python3
"""gpuready lab simulator: the small Kubernetes API client of the SIMULATED GPU Feature Discovery.

The lab's Kubernetes is real (the built kube-apiserver, kubeadm and kubelet, lab/kube/); this
client serves only the one simulator that talks to it, GPU Feature Discovery
(``daemons.py gpu_feature_discovery``), which labels its own Node with the real kubelet's
credentials. It runs inside lab hosts, so it has only Python's standard library. Reads the
kubeconfig the real kubeadm writes for the kubelet (one cluster, one user: ``server``,
``certificate-authority[-data]``, ``token``, ``client-certificate``/``client-key``); it is not a
general kubeconfig parser. Root-owned paths sit under ``$GPUREADY_LAB_ROOT`` (default /), so
tests can run it unprivileged.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SIMULATOR = "gpuready lab simulator"


def root(path: str) -> Path:
    return Path(os.environ.get("GPUREADY_LAB_ROOT", "/")) / path.lstrip("/")


class ApiFailure(Exception):
    """A request the API server answered with an error, or could not be sent."""

    def __init__(self, message: str, code: int = 0, status: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.status = status or {}


@dataclass
class Client:
    server: str  # https://host:port
    ca_pem: bytes | None  # None: do not verify the server
    token: str | None = None
    cert_file: str | None = None  # PEM with certificate and key
    timeout: float = 10.0

    def _context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.ca_pem is None:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context.load_verify_locations(cadata=self.ca_pem.decode())
        if self.cert_file:
            context.load_cert_chain(self.cert_file)
        return context

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> dict[str, Any]:
        url = urlsplit(self.server)
        conn = http.client.HTTPSConnection(url.hostname or "", url.port or 443,
                                           timeout=self.timeout, context=self._context())
        headers = {"Accept": "application/json", "User-Agent": f"{SIMULATOR}/gpu-feature-discovery"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
            raise ApiFailure(f'{method} "{self.server}{path}": {_reason(exc)}') from None
        finally:
            conn.close()
        try:
            doc = json.loads(raw or b"{}")
        except ValueError:
            doc = {"message": raw.decode(errors="replace")}
        if response.status >= 400:
            message = doc.get("message") if isinstance(doc, dict) else None
            raise ApiFailure(str(message or f"HTTP {response.status}"), response.status,
                             doc if isinstance(doc, dict) else {})
        return doc if isinstance(doc, dict) else {}


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "dial tcp: connect: connection refused"
    if isinstance(exc, TimeoutError):
        return "dial tcp: i/o timeout"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"tls: failed to verify certificate: {exc.verify_message}"
    return str(exc) or type(exc).__name__


# -- kubeconfig -----------------------------------------------------------------------------
def _field(text: str, name: str) -> str | None:
    match = re.search(rf"^\s*{re.escape(name)}:\s*(\S+)\s*$", text, re.MULTILINE)
    return match.group(1).strip("'\"") if match else None


def kubeconfig_client(path: Path) -> Client:
    """A client for the cluster and user of a kubeadm-written kubeconfig."""
    text = path.read_text()
    server = _field(text, "server")
    if not server:
        raise ApiFailure(f"{path}: no server in the kubeconfig")
    ca_data = _field(text, "certificate-authority-data")
    ca_file = _field(text, "certificate-authority")
    ca = base64.b64decode(ca_data) if ca_data else (Path(ca_file).read_bytes() if ca_file
                                                     else None)
    cert = _field(text, "client-certificate")
    return Client(server, ca, token=_field(text, "token"),
                  cert_file=str(root(cert)) if cert else None)
