"""The Kubernetes build (lab/kube/build.py, issue 29): the wrapper module's inputs agree with
each other, the cache is keyed by release and go.sum, and two builders never corrupt it.

The cache tests run the real lock and rename with a stand-in for the Go compiler (a script that
writes each -o file): a real build takes a quarter of an hour and is what `make setup` does.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import gobuild
from lab.errors import LabError
from lab.kube import build
from lab.paths import REPO_ROOT

GO_MOD = build.read_go_mod()
VERSION = GO_MOD.kubernetes_version


def test_go_mod_pins_one_release_the_build_knows() -> None:
    assert re.fullmatch(r"v1\.\d+\.\d+", VERSION)
    assert VERSION in build.RELEASES
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", build.RELEASES[VERSION].time)


def test_every_staging_module_is_replaced_by_its_release_of_the_same_version() -> None:
    staging = build.staging_version(VERSION)
    assert GO_MOD.replaces, "no replace lines"
    for module, (replacement, version) in GO_MOD.replaces.items():
        assert module.startswith("k8s.io/"), module
        assert (replacement, version) == (module, staging), module
    # Kubernetes requires its staging modules at the placeholder v0.0.0, which no proxy serves:
    # each such requirement needs its replace.
    placeholders = {m for m, v in GO_MOD.requires.items() if v == "v0.0.0"}
    assert placeholders and placeholders <= set(GO_MOD.replaces), placeholders - set(
        GO_MOD.replaces)
    assert GO_MOD.requires["go.etcd.io/etcd/server/v3"].startswith("v3.")


def test_go_sum_holds_the_sources_the_build_compiles() -> None:
    sums = build.GO_SUM.read_text()
    assert f"{build.KUBERNETES_MODULE} {VERSION} h1:" in sums
    etcd = GO_MOD.requires["go.etcd.io/etcd/server/v3"]
    assert f"go.etcd.io/etcd/server/v3 {etcd} h1:" in sums
    for module in set(GO_MOD.replaces) & set(GO_MOD.requires):
        assert f"{module} {build.staging_version(VERSION)} h1:" in sums, module


def test_the_tool_lines_are_exactly_what_is_built() -> None:
    assert sorted(GO_MOD.tools) == sorted(b.package for b in build.BINARIES)
    assert {b.name for b in build.BINARIES} >= {"kube-apiserver", "kube-controller-manager",
                                                 "kubelet", "kubeadm", "kubectl", "etcd"}


def test_binaries_are_linked_with_their_version_as_upstream_does() -> None:
    kubelet = next(b for b in build.BINARIES if b.name == "kubelet")
    argv = build.go_build_argv(kubelet, VERSION, Path("/out"))
    assert "-trimpath" in argv and "-tags=selinux,notest,grpcnotrace" in argv
    ldflags = next(a for a in argv if a.startswith("-ldflags=all="))
    major, minor = VERSION[1:].split(".")[:2]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion={VERSION} " in ldflags
        assert f"-X {package}.gitMajor={major} " in ldflags
        assert f"-X {package}.gitMinor={minor} " in ldflags
        assert f"-X {package}.buildDate={build.RELEASES[VERSION].time} " in ldflags
    assert ldflags.endswith("-s -w")
    etcd = build.go_build_argv(next(b for b in build.BINARIES if b.name == "etcd"), VERSION,
                               Path("/out"))
    assert not any(a.startswith("-tags") for a in etcd) and "gitVersion" not in " ".join(etcd)


def test_parse_go_mod_reads_single_lines_and_blocks() -> None:
    parsed = build.parse_go_mod(
        "module x\n\ngo 1.26.0\n\ntool k8s.io/kubernetes/cmd/kubelet\n"
        "require k8s.io/kubernetes v1.37.2\nrequire (\n\ta.b/c v1.0.0 // indirect\n)\n"
        "replace k8s.io/api => k8s.io/api v0.37.2\n")
    assert parsed.kubernetes_version == "v1.37.2"
    assert parsed.requires["a.b/c"] == "v1.0.0"
    assert parsed.replaces == {"k8s.io/api": ("k8s.io/api", "v0.37.2")}
    assert parsed.tools == ("k8s.io/kubernetes/cmd/kubelet",)
    with pytest.raises(LabError, match=r"no `require k8s\.io/kubernetes"):
        _ = build.parse_go_mod("module x\n").kubernetes_version


def test_an_unknown_release_is_named_with_where_its_facts_come_from() -> None:
    with pytest.raises(LabError, match=r"v1\.99\.0.*proxy\.golang\.org/k8s\.io/kubernetes/@v/"
                                       r"v1\.99\.0\.info"):
        build.version_ldflags("v1.99.0")


def test_cache_is_outside_the_checkout_and_keyed_by_release_and_go_sum(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUREADY_KUBE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_root() == tmp_path / "xdg" / "gpuready" / "kube"
    assert REPO_ROOT not in build.cache_root().parents
    monkeypatch.setenv("GPUREADY_KUBE_CACHE", str(tmp_path / "elsewhere"))
    assert build.cache_root() == tmp_path / "elsewhere"

    key = build.build_key()
    assert key.startswith(f"{VERSION}-") and key == build.build_key()
    # The same module with one more go.sum line: another key.
    changed = tmp_path / "module"
    changed.mkdir()
    (changed / "go.mod").write_text(build.CURRENT.go_mod.read_text())
    (changed / "go.sum").write_text(build.GO_SUM.read_text() + "example.com/x v1.0.0 h1:AAAA=\n")
    monkeypatch.setattr(build, "CURRENT", dataclasses.replace(build.CURRENT, module_dir=changed))
    assert build.build_key() != key


STAND_IN_GO = """#!/bin/sh
# A stand-in for the Go compiler: records each build and writes its -o file.
if [ "$1" = env ]; then echo go-stand-in; exit 0; fi
echo "$*" >> "$GO_LOG"
while [ ! -e "$GO_RELEASE" ]; do sleep 0.05; done
out=""; prev=""
for arg in "$@"; do [ "$prev" = -o ] && out=$arg; prev=$arg; done
case "$out" in *"/$GO_FAIL") echo "compile error in $GO_FAIL" >&2; exit 1;; esac
echo "binary $CGO_ENABLED" > "$out"
"""


def _stand_in_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str = "") -> Path:
    bindir = tmp_path / "gobin"
    bindir.mkdir()
    go = bindir / "go"
    go.write_text(STAND_IN_GO)
    go.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("GO_LOG", str(tmp_path / "go.log"))
    monkeypatch.setenv("GO_RELEASE", str(tmp_path / "release"))
    monkeypatch.setenv("GO_FAIL", fail)
    monkeypatch.setenv("GPUREADY_KUBE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "release"


def test_two_builders_build_once_and_both_get_the_whole_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = _stand_in_go(tmp_path, monkeypatch)
    argv = [sys.executable, "-m", "lab.kube.build"]
    first = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    log = tmp_path / "go.log"
    deadline = time.monotonic() + 30
    while not log.exists() and time.monotonic() < deadline:  # the first holds the lock
        time.sleep(0.05)
    err_file = tmp_path / "second.err"
    with err_file.open("w") as err_handle:
        second = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                  stderr=err_handle, text=True)
    # The first holds the build until released: the second must say it waits for it.
    deadline = time.monotonic() + 30
    while "waiting for another process's build" not in err_file.read_text():
        assert time.monotonic() < deadline and second.poll() is None, err_file.read_text()
        time.sleep(0.05)
    release.write_text("")
    out1, err1 = first.communicate(timeout=60)
    out2, _ = second.communicate(timeout=60)
    err2 = err_file.read_text()
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    target = tmp_path / "cache" / build.build_key()
    assert out1.strip() == out2.strip() == str(target / "bin")
    # Built once: the pinned release's binaries and the previous patch release's three.
    builds = len(build.BINARIES) + len(build.PREVIOUS_BINARIES)
    assert len(log.read_text().splitlines()) == builds
    previous = tmp_path / "cache" / build.PREVIOUS.key() / "bin"
    assert sorted(p.name for p in previous.iterdir()) == sorted(
        b.name for b in build.PREVIOUS_BINARIES)
    assert sorted(p.name for p in (target / "bin").iterdir()) == sorted(
        b.name for b in build.BINARIES)
    assert (target / "bin" / "kubelet").read_text() == "binary 1\n"  # cgo, as upstream
    assert (target / "bin" / "kube-apiserver").read_text() == "binary 0\n"
    assert (target / gobuild.MANIFEST).is_file()
    assert [p.name for p in target.parent.iterdir() if ".building" in p.name] == []
    # Built: a third run compiles nothing.
    assert build.ensure_built(log=False) == target / "bin"
    assert build.ensure_previous_built(log=False) == previous
    assert len(log.read_text().splitlines()) == builds


def test_a_failed_build_names_the_binary_and_leaves_no_partial_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = _stand_in_go(tmp_path, monkeypatch, fail="kubelet")
    release.write_text("")
    with pytest.raises(LabError, match=r"building kubelet \(k8s\.io/kubernetes/cmd/kubelet\) "
                                       r"failed \(exit 1\): compile error in kubelet"):
        build.ensure_built(log=False)
    cache = tmp_path / "cache"
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == []
