"""The example inventories a site copies first (inventory/*.example): each renders the cluster
layer, the node layer (the roles) and the cluster layer (the GPU Operator's values) start
exactly one DCGM host engine per GPU node and the exporter uses it, and every object passes
``cluster apply --check`` and a real apply on a real kube-apiserver with the pinned releases'
CRDs (tests/kube_helpers.py; as tests/unit/validate/test_cluster_apply.py).

The host engines are counted here from what each side declares, not from the renderer's own
constants: the bootstrap play and the ``nvidia_dcgm`` role's inputs (it runs NVIDIA's
``nvidia-dcgm`` unit, whose ``nv-hostengine`` has no listening option, so DCGM's defaults:
TCP port 5555 on 127.0.0.1), and the rendered ClusterPolicy and Helm values read as the GPU
Operator's controller reads them (``TransformDCGMExporter``: ``dcgm.enabled`` starts a
host-engine pod; an exporter without ``DCGM_REMOTE_HOSTENGINE_INFO`` / ``-r`` starts its own
embedded engine; one told ``localhost:<port>`` reaches the node only on the host's network)."""

from __future__ import annotations

import io
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube_helpers import LocalApiServer, core_api, running_apiserver
from tests.unit.validate.cluster_inventories import REPO
from tests.unit.validate.test_cluster_apply import CONTROLLERS, install_crds
from validate import cli
from validate.cluster import render
from validate.cluster.spec import load_spec
from validate.inventory import load
from validate.model import ExitCode

EXAMPLES = sorted(p.name for p in (REPO / "inventory").glob("*.example"))
DCGM_UNIT = (REPO / "tests/fixtures/vendor-repos/excerpts/nvidia-dcgm-4.6.0-nvidia-dcgm.service.in")
# DCGM's defaults for an nv-hostengine given no listening option (dcgm_structs.h
# DCGM_HE_PORT_NUMBER; HostEngineCommandLine.cpp --bind-interface default).
HOSTENGINE_PORT = 5555
HOSTENGINE_BIND = "127.0.0.1"
LISTEN_OPTIONS = ("-p", "--port", "-b", "--bind-interface", "-d", "--domain-socket")


def test_both_examples_are_found() -> None:
    assert EXAMPLES == ["production.example", "staging.example"]


# -- one DCGM host engine per node ----------------------------------------------------------

def roles_host_engine(inv: Path) -> dict[str, str | None]:
    """Per GPU node, the address of the host engine the roles start there (None: none)."""
    plays = yaml.safe_load((REPO / "playbooks" / "bootstrap.yml").read_text())
    runs_dcgm = any("gpu_nodes" in str(play.get("hosts", "")) and any(
        (r.get("role") if isinstance(r, Mapping) else r) == "nvidia_dcgm"
        for r in play.get("roles", [])) for play in plays)
    spec = yaml.safe_load((REPO / "roles/nvidia_dcgm/meta/argument_specs.yml").read_text())
    assert spec["argument_specs"]["main"]["options"]["nvidia_dcgm_version"]["required"] is True
    unit = yaml.safe_load((REPO / "roles/nvidia_dcgm/vars/main.yml").read_text())
    assert unit["_nvidia_dcgm_service"] == "nvidia-dcgm"
    # The role installs NVIDIA's unit as it is: no drop-in, template or file of its own.
    assert not any((REPO / "roles/nvidia_dcgm" / d).exists() for d in ("templates", "files"))
    exec_start = next(line for line in DCGM_UNIT.read_text().splitlines()
                      if line.startswith("ExecStart="))
    argv = exec_start.split()
    assert argv[0].endswith("/nv-hostengine")
    assert not set(argv) & set(LISTEN_OPTIONS), exec_start
    address = f"{HOSTENGINE_BIND}:{HOSTENGINE_PORT}"
    return {n.name: address if runs_dcgm and n.desired.pins.dcgm_version else None
            for n in load(inv)}


def _env(section: Mapping[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e.get("value", "")) for e in section.get("env") or []}


def _remote(section: Mapping[str, Any]) -> str | None:
    """The exporter's remote host engine (its env, or its -r/--remote-hostengine-info arg)."""
    remote = _env(section).get("DCGM_REMOTE_HOSTENGINE_INFO")
    args = [str(a) for a in section.get("args") or []]
    for i, arg in enumerate(args):
        if arg in ("-r", "--remote-hostengine-info") and i + 1 < len(args):
            remote = args[i + 1]
        elif arg.startswith("--remote-hostengine-info="):
            remote = arg.partition("=")[2]
    return remote or None


def operator_engines(policy: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """The host engines the GPU Operator starts on a node, and where its exporter's engine is:
    ``embedded``, ``host <address>`` or ``pod <address>`` (None: no exporter)."""
    engines = []
    if (policy.get("dcgm") or {}).get("enabled"):
        engines.append("operator nv-hostengine pod")
    exporter = policy.get("dcgmExporter") or {}
    if exporter.get("enabled") is False:
        return engines, None
    remote = _remote(exporter)
    if remote is None:
        engines.append("dcgm-exporter's embedded host engine")
        return engines, "embedded"
    host, _, port = remote.partition(":")
    local = host in ("localhost", "127.0.0.1")
    on_host_network = exporter.get("hostNetwork") is True or (
        # The operator's controller puts an exporter told "localhost..." on the host's
        # network itself (only that spelling, only with its own engine off).
        remote.startswith("localhost") and not (policy.get("dcgm") or {}).get("enabled"))
    where = "host" if local and on_host_network else "pod"
    return engines, f"{where} {HOSTENGINE_BIND if local else host}:{port or HOSTENGINE_PORT}"


def judge(host_engine: str | None, policy: Mapping[str, Any]) -> list[str]:
    """What is wrong with one node's DCGM: [] when exactly one host engine runs there and the
    exporter uses it."""
    engines, exporter = operator_engines(policy)
    if host_engine:
        engines.append(f"roles' nv-hostengine {host_engine}")
    problems = []
    if len(engines) != 1:
        problems.append(f"{len(engines)} host engines: {', '.join(engines) or 'none'}")
    if exporter not in (None, "embedded", "pod nvidia-dcgm:5555") and exporter != (
            f"host {host_engine}"):
        problems.append(f"the exporter connects to {exporter}, where no host engine runs")
    return problems


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_runs_one_host_engine_per_node_and_the_exporter_uses_it(
        tmp_path: Path, example: str) -> None:
    inv = REPO / "inventory" / example
    code, _, err = run_cli("cluster", "render", "-i", str(inv), "-o", str(tmp_path))
    assert (code, err) == (ExitCode.OK, ""), err
    policy = yaml.safe_load(next(tmp_path.glob("*-clusterpolicy-cluster-policy.yaml"))
                            .read_text())["spec"]
    values = yaml.safe_load((tmp_path / "helm" / "gpu-operator-values.yaml").read_text())
    engines = roles_host_engine(inv)
    assert engines and all(engines.values()), engines  # the examples pin DCGM on every node
    for node, address in engines.items():
        assert judge(address, policy) == [], node
        assert judge(address, values) == [], node  # the chart's values say the same
    assert operator_engines(policy) == ([], f"host {HOSTENGINE_BIND}:{HOSTENGINE_PORT}")


HOST = f"{HOSTENGINE_BIND}:{HOSTENGINE_PORT}"


def test_the_judge_fails_two_engines_or_none_the_exporter_can_use() -> None:
    """The test above can fail: each way the two layers can disagree is named."""
    exporter = {"enabled": True}
    remote = {"enabled": True, "hostNetwork": True,
              "env": [{"name": "DCGM_REMOTE_HOSTENGINE_INFO", "value": "localhost:5555"}]}
    # The values before issue 41: the exporter's embedded engine beside the roles'.
    assert judge(HOST, {"dcgm": {"enabled": False}, "dcgmExporter": exporter}) == [
        "2 host engines: dcgm-exporter's embedded host engine, roles' nv-hostengine "
        "127.0.0.1:5555"]
    # The operator's own engine pod beside the roles'.
    assert judge(HOST, {"dcgm": {"enabled": True},
                        "dcgmExporter": {**remote, "env": [
                            {"name": "DCGM_REMOTE_HOSTENGINE_INFO",
                             "value": "nvidia-dcgm:5555"}]}})[0].startswith("2 host engines")
    # An exporter told 127.0.0.1 on the pod network: its own namespace's loopback, where
    # nothing listens (the operator moves only a "localhost..." exporter to the host).
    loopback = {"enabled": True, "env": [{"name": "DCGM_REMOTE_HOSTENGINE_INFO",
                                          "value": "127.0.0.1:5555"}]}
    assert judge(HOST, {"dcgm": {"enabled": False}, "dcgmExporter": loopback}) == [
        "the exporter connects to pod 127.0.0.1:5555, where no host engine runs"]
    assert judge(HOST, {"dcgmExporter": {**loopback, "hostNetwork": True}}) == []
    # Roles without a host engine and an exporter told to use one: none it can use.
    assert judge(None, {"dcgm": {"enabled": False}, "dcgmExporter": remote}) == [
        "0 host engines: none",
        "the exporter connects to host 127.0.0.1:5555, where no host engine runs"]
    # Another port than the roles' engine listens on.
    other = {**remote, "env": [{"name": "DCGM_REMOTE_HOSTENGINE_INFO",
                                "value": "localhost:5556"}]}
    assert judge(HOST, {"dcgmExporter": other}) == [
        "the exporter connects to host 127.0.0.1:5556, where no host engine runs"]
    # What the examples render: one engine, the exporter on it.
    assert judge(HOST, {"dcgm": {"enabled": False}, "dcgmExporter": remote}) == []


# -- every example applies on a real API server --------------------------------------------

def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApiServer]:
    with running_apiserver(tmp_path_factory.mktemp("examples"), 23, CONTROLLERS) as server:
        install_crds(server.kubeconfig)
        core_api(server).create_namespace({"metadata": {"name": "gpu-operator"}})
        yield server


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_passes_check_and_apply_on_a_real_api_server(
        cluster: LocalApiServer, tmp_path: Path, example: str) -> None:
    inv = tmp_path / example
    shutil.copytree(REPO / "inventory" / example, inv)
    spec = load_spec(inv)
    kube = ("--kubeconfig", str(cluster.kubeconfig))
    code, out, err = run_cli("cluster", "apply", "-i", str(inv), "--check", *kube)
    assert (code, err) == (ExitCode.OK, ""), err
    assert out.startswith("cluster: check (server dry run, nothing changed) on https://")
    # Every object the server is given, for real: its validation (the CRDs' schemas, Pod
    # Security labels, quotas) accepts each one.
    code, out, err = run_cli("cluster", "apply", "-i", str(inv), *kube)
    assert (code, err) == (ExitCode.OK, ""), err
    total = len(render.manifests(spec))
    summary = out.splitlines()[-1]
    assert re.match(r"cluster: \d+ created, \d+ configured, \d+ deleted, \d+ unchanged; ",
                    summary), summary
    created, configured, _, unchanged = (int(n) for n in re.findall(r"(\d+) \w+", summary)[:4])
    assert created + configured + unchanged == total
    # And then the check mode has nothing left to change.
    code, out, err = run_cli("cluster", "apply", "-i", str(inv), "--check", *kube)
    assert (code, err) == (ExitCode.OK, "")
    assert out.splitlines()[-1].startswith(
        "cluster: 0 would be created, 0 would be configured, 0 would be deleted"), out
