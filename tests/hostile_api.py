"""A hostile Kubernetes API for tests: a TLS server in front of a real kube-apiserver
(tests/kube_helpers.py) that passes every request through to it, except those a test tells it to
answer wrong.

It is what a client meets when something other than the API server answers, or the API server
answers other than it should: a load balancer's HTML error page with status 200, a list of the
wrong kind (the real server's NodeList sent for a pod list), fields of the wrong type, JSON
nested 100,000 deep, a 404 for a resource an older cluster does not serve, a 403 from an
admission webhook. The client under test does real TLS (against this server's own CA, in the
kubeconfig :meth:`HostileApi.kubeconfig` writes) and real HTTP; what is not scripted is the
real server's own answer, so a test shows that the client acts on nothing wrong and that the
real cluster is left as it was.

Rules (:class:`Rule`) match a method and a path (a regular expression on the path and query)
and say what to send instead: a canned answer (:class:`Answer`), the real server's answer to
another request (:class:`Substitute`), or the real answer changed by a function
(:class:`Transform`). Every request is recorded (method, path, whether a rule answered it).
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import http.server
import ipaddress
import json
import re
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lab.kube.local import LocalApiServer, kubeconfig


@dataclass(frozen=True)
class Answer:
    """Send this, whatever was asked."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"


@dataclass(frozen=True)
class Substitute:
    """Send the real server's answer to ``GET path`` instead."""

    path: str


@dataclass(frozen=True)
class Transform:
    """Send the real server's answer with its JSON changed by ``change``: in place (it returns
    None), or into the bytes it returns."""

    change: Callable[[Any], bytes | None]


@dataclass(frozen=True)
class Rule:
    method: str
    path: str  # a regular expression matched against the path and query
    action: Answer | Substitute | Transform


def status_body(code: int, reason: str, message: str) -> bytes:
    """A ``Status`` as the API server words a failure."""
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                       "status": "Failure", "message": message, "reason": reason,
                       "code": code}).encode()


def _certificate(address: str) -> tuple[bytes, bytes]:
    """A self-signed certificate for ``address`` (an IP SAN) and its key, PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuready-hostile-api")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


@dataclass
class HostileApi:
    upstream: LocalApiServer
    address: str
    rules: list[Rule] = field(default_factory=list)
    requests: list[tuple[str, str, bool]] = field(default_factory=list)
    port: int = 0
    cert_pem: bytes = b""

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """A kubeconfig for this server (its CA, the real server's admin token or ``token``)."""
        path.write_text(kubeconfig(self.url, self.cert_pem, token or self.upstream.token))
        return path

    def writes(self) -> list[tuple[str, str, bool]]:
        """The requests that were not reads."""
        return [r for r in self.requests if r[0] not in ("GET", "HEAD")]

    def _rule(self, method: str, target: str) -> Rule | None:
        return next((r for r in self.rules
                     if r.method == method and re.search(r.path, target)), None)

    def forward(self, method: str, target: str, headers: dict[str, str],
                body: bytes | None) -> tuple[int, str, bytes]:
        context = ssl.create_default_context(cadata=self.upstream.ca_pem.decode())
        conn = http.client.HTTPSConnection(self.upstream.address, 6443, context=context,
                                           timeout=30)
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            return (response.status, response.getheader("Content-Type") or "",
                    response.read())
        finally:
            conn.close()

    def answer(self, method: str, target: str, headers: dict[str, str],
               body: bytes | None) -> tuple[int, str, bytes]:
        rule = self._rule(method, target)
        self.requests.append((method, target, rule is not None))
        if rule is None:
            return self.forward(method, target, headers, body)
        action = rule.action
        if isinstance(action, Answer):
            return action.status, action.content_type, action.body
        if isinstance(action, Substitute):
            return self.forward("GET", action.path, headers, None)
        status, ctype, data = self.forward(method, target, headers, body)
        doc = json.loads(data)
        changed = action.change(doc)
        return status, ctype, changed if changed is not None else json.dumps(doc).encode()


def _handler(api: HostileApi) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() in ("authorization", "content-type", "accept")}
            status, ctype, data = api.answer(self.command, self.path, headers, body)
            self.send_response(status)
            self.send_header("Content-Type", ctype or "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _any

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextlib.contextmanager
def hostile_api(upstream: LocalApiServer, address: str,
                rules: list[Rule] | None = None) -> Iterator[HostileApi]:
    """A :class:`HostileApi` in front of ``upstream`` on ``address`` (a free port), served
    from a thread until the ``with`` ends."""
    api = HostileApi(upstream, address, list(rules or ()))
    cert, key = _certificate(address)
    api.cert_pem = cert
    server = http.server.ThreadingHTTPServer((address, 0), _handler(api))
    server.daemon_threads = True
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "cert.pem").write_bytes(cert)
        (Path(tmp) / "key.pem").write_bytes(key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(Path(tmp) / "cert.pem", Path(tmp) / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    api.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def deep_body(doc: Any, depth: int) -> bytes:
    """``doc`` as JSON with the string ``"DEEP"`` replaced by ``depth`` nested lists (too deep
    for Python's json to write, so it is spliced in as text)."""
    return json.dumps(doc).replace('"DEEP"', "[" * depth + "]" * depth).encode()


__all__ = ["Answer", "HostileApi", "Rule", "Substitute", "Transform", "deep_body",
           "hostile_api", "status_body"]
