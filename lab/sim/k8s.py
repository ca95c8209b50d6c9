#!/usr/bin/env python3
"""gpuready lab simulator: ``kubeadm`` (version, token, join, reset) and ``kubectl version
--client``.

The command is env GPUREADY_SIM_TOOL (kubeadm | kubectl), the version env GPUREADY_SIM_VERSION
(e.g. 1.30.5). Version shapes, from public captures of the real v1.30 binaries:
  kubeadm version            -> kubeadm version: &version.Info{Major:"1", Minor:"30",
                                GitVersion:"v1.30.5", GitCommit:"...", GitTreeState:"clean",
                                BuildDate:"...", GoVersion:"go1.22.6", Compiler:"gc",
                                Platform:"linux/amd64"}
  kubeadm version -o short   -> v1.30.5
  kubeadm version -o json    -> {"clientVersion": {major, minor, gitVersion, ...}} (indented)
  kubectl version --client   -> Client Version: v1.30.5 / Kustomize Version: v5.0.4-...
  kubectl version --client -o json|yaml -> {"clientVersion": {...}, "kustomizeVersion": "..."}
The simulator is named only in the human output (an extra last line), never inside -o data.
Build metadata (commit, build date, Go version) is the real release's for 1.30.4 and 1.30.5;
other versions carry the simulator's name in gitCommit.

The cluster commands talk to the lab's API server stand-in over HTTPS, as the real ones do:
  kubeadm token create [TOKEN] [--ttl 24h0m0s] [--description D] [--print-join-command]
      a bootstrap token Secret in kube-system (kubeconfig /etc/kubernetes/admin.conf); prints
      the token (and with --print-join-command the join command with the CA pin)
  kubeadm token delete TOKEN_ID...
  kubeadm join --config FILE | kubeadm join HOST:PORT --token T
          --discovery-token-ca-cert-hash sha256:H [--node-name N]
      discovery: cluster-info fetched without credentials, its JWS checked against the token,
      the CA's public key checked against the pins; TLS bootstrap: a CSR for
      system:node:<name> created with the token and its certificate collected; registration:
      the Node created with the configuration's labels (kubeletExtraArgs node-labels) and
      taints; then /etc/kubernetes/pki/ca.crt, /var/lib/kubelet/{config.yaml,
      kubeadm-flags.env} and, last, /etc/kubernetes/kubelet.conf are written and the kubelet
      restarted. Any failure leaves no kubelet.conf and no client certificate behind.
      The JoinConfiguration is read in its JSON form (JSON is YAML; the real kubeadm reads it).
  kubeadm reset [--force]
      stops the kubelet, deletes /etc/kubernetes/{kubelet.conf,bootstrap-kubelet.conf,pki},
      and the contents of /var/lib/kubelet.
Root-owned paths sit under $GPUREADY_LAB_ROOT (default /) so tests can run it unprivileged.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import string
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubeclient
from kubeclient import ApiFailure, Client, root

SIMULATOR = "gpuready lab simulator"
KUSTOMIZE = "v5.0.4-0.20230601165947-6ce0bf390ce3"
# Release metadata of the real builds, as `kubeadm version` prints them.
RELEASES = {
    "1.30.4": ("a51b3b711150f57ffc1f526a640ec058514ed596", "2024-08-14T19:02:46Z", "go1.22.5"),
    "1.30.5": ("74e84a90c725047b1328ff3d589fedb1cb7a120e", "2024-09-12T00:17:07Z", "go1.22.6"),
}


def version_info(version: str) -> dict[str, str]:
    """The version.Info fields in the order Kubernetes prints them."""
    commit, build_date, go_version = RELEASES.get(
        version, (SIMULATOR, "1970-01-01T00:00:00Z", "go1.22.6")
    )
    major, minor = version.split(".")[:2]
    return {
        "major": major, "minor": minor, "gitVersion": f"v{version}", "gitCommit": commit,
        "gitTreeState": "clean", "buildDate": build_date, "goVersion": go_version,
        "compiler": "gc", "platform": "linux/amd64",
    }


def _output_format(args: list[str]) -> str:
    for i, arg in enumerate(args):
        if arg in ("-o", "--output") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(("-o=", "--output=")):
            return arg.split("=", 1)[1]
        if arg.startswith("-o") and len(arg) > 2:
            return arg[2:]
    return ""


def _yaml(doc: dict[str, Any], indent: int = 0) -> str:
    out = ""
    for key, value in doc.items():
        if isinstance(value, dict):
            out += " " * indent + f"{key}:\n" + _yaml(value, indent + 2)
        else:
            # sigs.k8s.io/yaml quotes strings YAML would read as numbers or timestamps.
            quote = value.isdigit() or (value[:4].isdigit() and "T" in value)
            out += " " * indent + f"{key}: {json.dumps(value) if quote else value}\n"
    return out


def kubeadm_version(args: list[str], version: str) -> int:
    info = version_info(version)
    fmt = _output_format(args)
    if fmt == "short":
        print(info["gitVersion"])
    elif fmt == "json":
        print(json.dumps({"clientVersion": info}, indent=2))
    elif fmt == "yaml":
        sys.stdout.write(_yaml({"clientVersion": info}))
    elif fmt == "":
        fields = ", ".join(f'{k[0].upper()}{k[1:]}:"{v}"' for k, v in info.items())
        print(f"kubeadm version: &version.Info{{{fields}}}")
        print(f"# {SIMULATOR}")
    else:
        print(f"error: invalid output format: {fmt}", file=sys.stderr)
        return 1
    return 0


def kubeadm(args: list[str], version: str) -> int:
    commands = {"version": kubeadm_version, "token": kubeadm_token, "join": kubeadm_join,
                "reset": kubeadm_reset}
    if not args or args[0] not in commands:
        print(f"kubeadm: only {', '.join(commands)} are simulated here ({SIMULATOR})",
              file=sys.stderr)
        return 1
    try:
        return commands[args[0]](args[1:], version)
    except PhaseError as exc:
        print(f"error execution phase {exc.phase}: {exc}", file=sys.stderr)
        print("To see the stack trace of this error execute with --v=5 or higher",
              file=sys.stderr)
        return 1
    except (ApiFailure, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


class PhaseError(Exception):
    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase


ADMIN_CONF = "/etc/kubernetes/admin.conf"
KUBELET_CONF = "/etc/kubernetes/kubelet.conf"
BOOTSTRAP_CONF = "/etc/kubernetes/bootstrap-kubelet.conf"
CA_CRT = "/etc/kubernetes/pki/ca.crt"
KUBELET_DIR = "/var/lib/kubelet"
KUBELET_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
DEFAULT_GROUP = "system:bootstrappers:kubeadm:default-node-token"
TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration for h/m/s/ms (seconds)."""
    if text in ("0", "0s"):
        return 0.0
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f'time: invalid duration "{text}"')
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def _flag(args: list[str], name: str, default: str | None = None) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def _positionals(args: list[str], valued: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in valued:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def _secret_data(values: dict[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}


def kubeadm_token(args: list[str], _version: str) -> int:
    valued = ("--ttl", "--description", "--kubeconfig", "--usages", "--groups")
    words = _positionals(args, valued)
    action = words[0] if words else ""
    client = kubeclient.kubeconfig_client(root(_flag(args, "--kubeconfig", ADMIN_CONF) or ""))
    if action == "create":
        token = words[1] if len(words) > 1 else ""
        if token and not TOKEN_RE.match(token):
            raise ValueError(f'the bootstrap token "{token}" was not of the form '
                             '"^([a-z0-9]{6})\\.([a-z0-9]{16})$"')
        if not token:
            alphabet = string.ascii_lowercase + string.digits
            token = "".join(secrets.choice(alphabet) for _ in range(6)) + "." + "".join(
                secrets.choice(alphabet) for _ in range(16))
        token_id, token_secret = token.split(".")
        ttl = parse_duration(_flag(args, "--ttl", "24h0m0s") or "24h0m0s")
        values = {"token-id": token_id, "token-secret": token_secret,
                  "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
                  "auth-extra-groups": DEFAULT_GROUP}
        if ttl > 0:
            expires = datetime.now(UTC) + timedelta(seconds=ttl)
            values["expiration"] = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
        description = _flag(args, "--description")
        if description:
            values["description"] = description
        client.request("POST", "/api/v1/namespaces/kube-system/secrets", {
            "apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
            "metadata": {"name": f"bootstrap-token-{token_id}", "namespace": "kube-system"},
            "data": _secret_data(values)})
        if "--print-join-command" in args:
            assert client.ca_pem is not None
            endpoint = client.server.removeprefix("https://")
            pin = kubeclient.ca_public_key_hash(client.ca_pem)
            print(f"kubeadm join {endpoint} --token {token} --discovery-token-ca-cert-hash {pin} ")
        else:
            print(token)
        return 0
    if action == "delete" and len(words) > 1:
        for token in words[1:]:
            token_id = token.split(".")[0]
            client.request("DELETE",
                           f"/api/v1/namespaces/kube-system/secrets/bootstrap-token-{token_id}")
            print(f'bootstrap token "{token_id}" deleted')
        return 0
    raise ValueError("usage: kubeadm token create [TOKEN] [--ttl D] | kubeadm token delete ID")


# -- join -----------------------------------------------------------------------------------
def _join_config(args: list[str]) -> dict[str, Any]:
    """The JoinConfiguration from --config (JSON form), or from the command line's flags."""
    path = _flag(args, "--config")
    if path:
        text = "\n".join(line for line in Path(path).read_text().splitlines()
                         if not line.lstrip().startswith("#"))
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise PhaseError("preflight", f"unable to read config from {path!r}: the "
                             f"{SIMULATOR} reads JoinConfiguration in JSON form ({exc})") from None
        if doc.get("kind") != "JoinConfiguration":
            raise PhaseError("preflight", f"{path}: no JoinConfiguration kind was found")
        return doc
    endpoint = _positionals(args, ("--token", "--discovery-token-ca-cert-hash", "--node-name",
                                   "--cri-socket"))
    return {"apiVersion": "kubeadm.k8s.io/v1beta3", "kind": "JoinConfiguration",
            "discovery": {"bootstrapToken": {
                "apiServerEndpoint": endpoint[0] if endpoint else "",
                "token": _flag(args, "--token") or "",
                "caCertHashes": [h for h in [_flag(args, "--discovery-token-ca-cert-hash")] if h],
                "unsafeSkipCAVerification": "--discovery-token-unsafe-skip-ca-verification"
                in args}},
            "nodeRegistration": {"name": _flag(args, "--node-name") or os.uname().nodename}}


def _kubelet_args(registration: dict[str, Any]) -> dict[str, str]:
    extra = registration.get("kubeletExtraArgs") or {}
    if isinstance(extra, list):  # v1beta4: [{name, value}]
        extra = {e.get("name", ""): e.get("value", "") for e in extra}
    return {str(k): str(v) for k, v in extra.items()}


def _discover(bootstrap: dict[str, Any], token_id: str, token_secret: str,
              timeout_s: float) -> tuple[str, bytes]:
    """cluster-info, validated: (server URL, CA PEM)."""
    endpoint = bootstrap.get("apiServerEndpoint") or ""
    if not endpoint:
        raise PhaseError("preflight", "discovery.bootstrapToken.apiServerEndpoint: Required "
                         "value: the API server endpoint is required")
    insecure = Client(f"https://{endpoint}", None, timeout=5.0)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            info = insecure.request("GET", "/api/v1/namespaces/kube-public/configmaps/"
                                    "cluster-info")
            break
        except ApiFailure as exc:
            if time.monotonic() >= deadline:
                raise PhaseError("preflight", "couldn't validate the identity of the API "
                                 f"Server: failed to request the cluster-info ConfigMap: "
                                 f"{exc}") from None
            print(f"[discovery] Failed to request cluster-info, will try again: {exc}",
                  flush=True)
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
    data = info.get("data") or {}
    kubeconfig = data.get("kubeconfig", "")
    signature = data.get(f"jws-kubeconfig-{token_id}")
    if not signature:
        raise PhaseError("preflight", "couldn't validate the identity of the API Server: "
                         f'token id "{token_id}" is invalid for this cluster or it has '
                         'expired. Use "kubeadm token create" on the control-plane node to '
                         "create a new valid token")
    if not _jws_valid(signature, kubeconfig, token_id, token_secret):
        raise PhaseError("preflight", "couldn't validate the identity of the API Server: "
                         "failed to verify JWS signature of received cluster info object, "
                         "can't trust this API Server")
    server = re.search(r"^\s*server:\s*(\S+)", kubeconfig, re.MULTILINE)
    ca_data = re.search(r"^\s*certificate-authority-data:\s*(\S+)", kubeconfig, re.MULTILINE)
    if server is None or ca_data is None:
        raise PhaseError("preflight", "couldn't validate the identity of the API Server: the "
                         "cluster-info kubeconfig has no cluster")
    ca_pem = base64.b64decode(ca_data.group(1))
    pins = [str(p) for p in bootstrap.get("caCertHashes") or []]
    if pins:
        actual = kubeclient.ca_public_key_hash(ca_pem)
        if actual not in pins:
            raise PhaseError("preflight", "couldn't validate the identity of the API Server: "
                             "cluster CA found in cluster-info ConfigMap is invalid: none of "
                             f'the public keys "{actual}" are pinned')
    elif not bootstrap.get("unsafeSkipCAVerification"):
        raise PhaseError("preflight", 'discovery.bootstrapToken: Invalid value: "": using '
                         "token-based discovery without caCertHashes can be unsafe. Set "
                         "unsafeSkipCAVerification as true in your kubeadm config file or pass "
                         "--discovery-token-unsafe-skip-ca-verification flag to continue")
    return server.group(1), ca_pem


def _jws_valid(detached: str, content: str, token_id: str, token_secret: str) -> bool:
    import hashlib  # noqa: PLC0415 (join only)
    import hmac  # noqa: PLC0415 (join only)

    header, _, signature = detached.partition("..")
    try:
        parsed = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
    except ValueError:
        return False
    if parsed.get("alg") != "HS256" or parsed.get("kid") != token_id:
        return False
    payload = base64.urlsafe_b64encode(content.encode()).rstrip(b"=").decode()
    mac = hmac.new(token_secret.encode(), f"{header}.{payload}".encode(), hashlib.sha256)
    expected = base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()
    return hmac.compare_digest(expected, signature)


def _tls_bootstrap(trusted: Client, name: str) -> bytes:
    """A kubelet client certificate for ``name``: key + certificate, PEM."""
    key, csr = kubeclient.new_key_and_csr(f"system:node:{name}", "system:nodes")
    created = trusted.request("POST", "/apis/certificates.k8s.io/v1/certificatesigningrequests",
                              {"apiVersion": "certificates.k8s.io/v1",
                               "kind": "CertificateSigningRequest",
                               "metadata": {"generateName": "csr-"},
                               "spec": {"request": base64.b64encode(csr).decode(),
                                        "signerName": KUBELET_SIGNER,
                                        "usages": ["digital signature", "client auth"]}})
    csr_name = created["metadata"]["name"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        current = trusted.request(
            "GET", f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{csr_name}")
        status = current.get("status") or {}
        for condition in status.get("conditions") or []:
            if condition.get("type") in ("Denied", "Failed"):
                raise ApiFailure(f"certificate request {csr_name} was "
                                 f"{condition['type'].lower()}: {condition.get('message', '')}")
        if status.get("certificate"):
            return base64.b64decode(status["certificate"]) + key
        time.sleep(0.5)
    raise ApiFailure(f"timed out waiting for the certificate of {csr_name}")


def _write(path: Path, text: str | bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(text.encode() if isinstance(text, str) else text)
    os.replace(tmp, path)


def _restart_kubelet() -> None:
    if not Path("/run/systemd/system").exists() or "GPUREADY_LAB_ROOT" in os.environ:
        print("[kubelet-start] WARNING: unable to start the kubelet service: no systemd "
              "here; please ensure kubelet is reloaded and running manually.")
        return
    proc = subprocess.run(["systemctl", "restart", "kubelet"], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        print("[kubelet-start] WARNING: unable to start the kubelet service: "
              f"{proc.stderr.strip()}")


def kubeadm_join(args: list[str], _version: str) -> int:
    print(f"[preflight] Running pre-flight checks ({SIMULATOR})", flush=True)
    fatal = [f"\t[ERROR FileAvailable-{p.replace('/', '-')}]: {p} already exists"
             for p in (KUBELET_CONF, CA_CRT) if root(p).exists()]
    if fatal:
        raise PhaseError("preflight", "[preflight] Some fatal errors occurred:\n" +
                         "\n".join(fatal) + "\n[preflight] If you know what you are doing, "
                         "you can make a check non-fatal with `--ignore-preflight-errors=...`")
    config = _join_config(args)
    discovery = config.get("discovery") or {}
    bootstrap = discovery.get("bootstrapToken") or {}
    token = str(discovery.get("tlsBootstrapToken") or bootstrap.get("token") or "")
    match = TOKEN_RE.match(token)
    if match is None:
        raise PhaseError("preflight", 'discovery.bootstrapToken.token: Invalid value: "": the '
                         "bootstrap token is invalid")
    registration = config.get("nodeRegistration") or {}
    name = str(registration.get("name") or os.uname().nodename)
    timeout_s = parse_duration(str(discovery.get("timeout") or "5m0s"))
    server, ca_pem = _discover(bootstrap, match.group(1), match.group(2), timeout_s)
    trusted = Client(server, ca_pem, token=token)
    try:
        existing = trusted.request("GET", f"/api/v1/nodes/{name}")
    except ApiFailure as exc:
        if exc.code != 404:
            raise PhaseError("preflight", f"unable to fetch the Node {name!r}: {exc}") from None
        existing = {}
    ready = [c for c in (existing.get("status") or {}).get("conditions") or []
             if c.get("type") == "Ready" and c.get("status") == "True"]
    if ready:
        raise PhaseError("kubelet-start", f'a Node with name "{name}" and status "Ready" '
                         "already exists in the cluster. You must delete the existing Node or "
                         "change the name of this new joining Node")
    print(f"[kubelet-start] Writing kubelet configuration to file "
          f'"{KUBELET_DIR}/config.yaml"', flush=True)
    try:
        pem = _tls_bootstrap(trusted, name)
    except ApiFailure as exc:
        raise PhaseError("kubelet-start", "the TLS bootstrap of the kubelet failed: "
                         f"{exc}") from None
    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H-%M-%S")
    pki = root(KUBELET_DIR) / "pki"
    cert_path = pki / f"kubelet-client-{stamp}.pem"
    current = pki / "kubelet-client-current.pem"
    _write(cert_path, pem, 0o600)
    current.unlink(missing_ok=True)
    current.symlink_to(cert_path.name)
    kubelet_args = _kubelet_args(registration)
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
              "beta.kubernetes.io/arch": "amd64"}
    for pair in filter(None, kubelet_args.get("node-labels", "").split(",")):
        key, _, value = pair.partition("=")
        labels[key.strip()] = value.strip()
    taints = [{k: t[k] for k in ("key", "value", "effect") if t.get(k)}
              for t in registration.get("taints") or []]
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {
                "kubeadm.alpha.kubernetes.io/cri-socket": str(
                    registration.get("criSocket") or "unix:///var/run/containerd/containerd.sock"),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            "spec": {"taints": taints} if taints else {}}
    kubelet = Client(server, ca_pem, cert_file=str(current))
    try:
        try:
            kubelet.request("POST", "/api/v1/nodes", node)
        except ApiFailure as exc:
            if exc.code != 409:
                raise
    except ApiFailure as exc:
        shutil.rmtree(pki, ignore_errors=True)
        raise PhaseError("kubelet-start", f"the kubelet could not register the Node {name!r}: "
                         f"{exc}") from None
    flags = [f"--hostname-override={name}",
             "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock"]
    if kubelet_args.get("node-labels"):
        flags.append(f"--node-labels={kubelet_args['node-labels']}")
    if taints:
        flags.append("--register-with-taints=" + ",".join(
            f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in taints))
    _write(root(CA_CRT), ca_pem, 0o644)
    _write(root(KUBELET_DIR) / "config.yaml",
           "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
           f"# written by kubeadm join ({SIMULATOR})\ncgroupDriver: systemd\n"
           "authentication:\n  x509:\n    clientCAFile: /etc/kubernetes/pki/ca.crt\n", 0o644)
    print(f'[kubelet-start] Writing kubelet environment file with flags to file '
          f'"{KUBELET_DIR}/kubeadm-flags.env"', flush=True)
    _write(root(KUBELET_DIR) / "kubeadm-flags.env",
           f'KUBELET_KUBEADM_ARGS="{" ".join(flags)}"\n', 0o644)
    # Last: kubelet.conf is the mark of a joined node, so it exists only when all else did.
    _write(root(KUBELET_CONF), kubeclient.kubeconfig_text(
        server, ca_pem, "default-auth", cert_file=f"{KUBELET_DIR}/pki/kubelet-client-current.pem"),
        0o600)
    print("[kubelet-start] Starting the kubelet", flush=True)
    _restart_kubelet()
    print("[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap\n\n"
          "This node has joined the cluster:\n"
          "* Certificate signing request was sent to apiserver and a response was received.\n"
          "* The Kubelet was informed of the new secure connection details.\n\n"
          "Run 'kubectl get nodes' on the control-plane to see this node join the cluster.")
    return 0


def kubeadm_reset(args: list[str], _version: str) -> int:
    if not ({"--force", "-f"} & set(args)):
        answer = input("[reset] Are you sure you want to proceed? [y/N]: ")
        if answer.strip().lower() != "y":
            raise PhaseError("preflight", "aborted reset operation")
    print(f"[reset] Stopping the kubelet service ({SIMULATOR})")
    if Path("/run/systemd/system").exists() and "GPUREADY_LAB_ROOT" not in os.environ:
        subprocess.run(["systemctl", "stop", "kubelet"], capture_output=True, check=False)
    dirs = ["/etc/kubernetes/manifests", KUBELET_DIR, "/etc/kubernetes/pki"]
    print(f"[reset] Deleting contents of directories: [{' '.join(dirs)}]")
    for directory in dirs:
        path = root(directory)
        if path.is_dir():
            for entry in path.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
    files = [ADMIN_CONF, KUBELET_CONF, BOOTSTRAP_CONF]
    print(f"[reset] Deleting files: [{' '.join(files)}]")
    for file in files:
        root(file).unlink(missing_ok=True)
    return 0


def kubectl(args: list[str], version: str) -> int:
    if not args or args[0] != "version" or "--client" not in args:
        print(
            f"kubectl: only `kubectl version --client` is simulated here ({SIMULATOR})",
            file=sys.stderr,
        )
        return 1
    info = version_info(version)
    doc = {"clientVersion": info, "kustomizeVersion": KUSTOMIZE}
    fmt = _output_format(args)
    if fmt == "json":
        print(json.dumps(doc, indent=2))
    elif fmt == "yaml":
        sys.stdout.write(_yaml(doc))
    elif fmt == "":
        print(f"Client Version: {info['gitVersion']}\nKustomize Version: {KUSTOMIZE}")
        print(f"# {SIMULATOR}")
    else:
        print(f"error: --output {fmt} is not available", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    tool = os.environ.get("GPUREADY_SIM_TOOL", "kubectl")
    version = os.environ.get("GPUREADY_SIM_VERSION", "1.30.5")
    if tool == "kubeadm":
        return kubeadm(argv[1:], version)
    return kubectl(argv[1:], version)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
