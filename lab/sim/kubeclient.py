#!/usr/bin/env python3
"""gpuready lab simulator: the small Kubernetes API client the lab's kubeadm and kubelet use.

Runs inside lab hosts, so it has only Python's standard library and the host's ``openssl``
command. Reads the kubeconfigs kubeadm writes (one cluster, one user: ``server``,
``certificate-authority[-data]``, ``token``, ``client-certificate``/``client-key``); it is not a
general kubeconfig parser. Root-owned paths sit under ``$GPUREADY_LAB_ROOT`` (default /), so
tests can run the tools unprivileged.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import ssl
import subprocess
import tempfile
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
    ca_pem: bytes | None  # None: do not verify the server (kubeadm's discovery request)
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
        headers = {"Accept": "application/json", "User-Agent": f"{SIMULATOR}/kubeadm-kubelet"}
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


def kubeconfig_text(server: str, ca_pem: bytes, user: str, *, token: str | None = None,
                    cert_file: str | None = None) -> str:
    """A kubeconfig as kubeadm writes kubelet.conf and admin.conf."""
    auth = (f"    token: {token}\n" if token else
            f"    client-certificate: {cert_file}\n    client-key: {cert_file}\n")
    ca = base64.b64encode(ca_pem).decode()
    return ("apiVersion: v1\nclusters:\n- cluster:\n"
            f"    certificate-authority-data: {ca}\n    server: {server}\n"
            "  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n"
            f"    namespace: default\n    user: {user}\n  name: default-context\n"
            "current-context: default-context\nkind: Config\npreferences: {}\nusers:\n"
            f"- name: {user}\n  user:\n{auth}")


# -- openssl --------------------------------------------------------------------------------
def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=False)
    if proc.returncode != 0:
        raise ApiFailure(f"openssl {args[0]}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def ca_public_key_hash(ca_pem: bytes) -> str:
    """``sha256:<hex>`` of the certificate's DER SubjectPublicKeyInfo, as kubeadm pins it."""
    pubkey = _openssl("x509", "-noout", "-pubkey", stdin=ca_pem)
    der = _openssl("pkey", "-pubin", "-outform", "DER", stdin=pubkey)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def new_key_and_csr(common_name: str, organization: str) -> tuple[bytes, bytes]:
    """A new ECDSA P-256 key and a CSR for it (PEM), as the kubelet's TLS bootstrap makes."""
    with tempfile.TemporaryDirectory(prefix="kubelet-csr-") as tmp:
        key = Path(tmp) / "key.pem"
        csr = _openssl("req", "-new", "-newkey", "ec", "-pkeyopt",
                       "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key),
                       "-subj", f"/O={organization}/CN={common_name}")
        return key.read_bytes(), csr
