"""The runner and framework: one tool call per node, every failure mode becomes a row with a
stable code, nodes run in parallel, and the storage checks leave the disk as they found it.

Node answers are REAL captures served by a scripted transport (or real commands through the
local transport); only the transport is scripted, never the checks' verdicts.
"""

from __future__ import annotations

import gc
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from validate import runner
from validate.checks import gpu, select
from validate.checks.base import Check, NodeContext, Verdict
from validate.inventory import Node
from validate.model import ExitCode, Status, exit_code_for
from validate.parsers import nvidia_smi_xml
from validate.transport import CommandResult, Unreachable, Unresponsive
from validate.transport.local import LocalTransport

Answer = Callable[[tuple[str, ...]], CommandResult]


class ScriptedTransport:
    """Answers argv with canned results (real captures), records every call."""

    def __init__(
        self, host: str, answers: dict[tuple[str, ...], Answer], delay_s: float = 0.0
    ) -> None:
        self._host = host
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []
        self.delay_s = delay_s
        self.closed = False
        self.aborted: tuple[str, str] | None = None
        self.barrier: threading.Barrier | None = None

    @property
    def host(self) -> str:
        return self._host

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        key = tuple(argv)
        self.calls.append(key)
        if self.barrier is not None:
            self.barrier.wait()  # BrokenBarrierError unless every node is in here at once
        if self.delay_s:
            time.sleep(self.delay_s)
        for prefix, answer in self.answers.items():
            if key[: len(prefix)] == prefix:
                return answer(key)
        return CommandResult(key, 127, "", f"sh: {key[0]}: not found", 0.01)

    def close(self) -> None:
        self.closed = True

    def abort(self, code: str, reason: str) -> None:
        self.aborted = (code, reason)


def _out(text: str, rc: int = 0) -> Answer:
    return lambda argv: CommandResult(argv, rc, text, "", 0.05)


def _node(name: str = "n1", profile: str = "a100-sxm4-80gb-8x", **vars_: object) -> Node:
    return Node(
        name=name,
        address="127.0.0.1",
        port=22,
        user="root",
        connection="ssh",
        key_file=None,
        known_hosts=None,
        accept_unknown_host_keys=False,
        pool="pool_a100_sxm",
        profile=profile,
        gpu_pool={"fabric": "infiniband"},
        vars={"nvidia_driver_version": "535.54.03", **vars_},
    )


GPU_QUERY_CHECKS = (
    "gpu.count,gpu.model,gpu.memory,gpu.driver,gpu.ecc,gpu.pcie,gpu.persistence,gpu.throttle"
)


def test_one_nvidia_smi_call_serves_every_gpu_check(fixtures_dir: Path) -> None:
    xml = (fixtures_dir / "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml").read_text()
    t = ScriptedTransport("n1", {("nvidia-smi", "-q", "-x"): _out(xml)})
    rows = runner.run_node(_node(), select(GPU_QUERY_CHECKS), "r1", t)
    assert t.calls == [("nvidia-smi", "-q", "-x")]
    by = {(r.check, r.metric): r for r in rows}
    assert {r.check for r in rows} == set(GPU_QUERY_CHECKS.split(","))
    assert by[("gpu.model", "gpu_model")].status is Status.PASS
    assert by[("gpu.driver", "driver_version")].status is Status.PASS
    count = by[("gpu.count", "gpu_count")]
    assert (count.status, count.code, count.value) == (Status.FAIL, "gpu.count.missing", 1.0)
    assert all(r.run_id == "r1" and r.node == "n1" and r.pool == "pool_a100_sxm" for r in rows)


def test_the_xml_is_parsed_once_per_node_and_a_parse_error_reaches_every_check(
    fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight gpu.* checks share one parse of ``-q -x`` (at 1,000 nodes, parsing it per check
    was two thirds of the validator's CPU); a parse error is still every check's row."""
    xml = (fixtures_dir / "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml").read_text()
    parses: list[str] = []
    real_parse = nvidia_smi_xml.parse

    def counting_parse(text: str) -> object:
        parses.append(text)
        return real_parse(text)

    monkeypatch.setattr(gpu.nvidia_smi_xml, "parse", counting_parse)
    t = ScriptedTransport("n1", {("nvidia-smi", "-q", "-x"): _out(xml)})
    rows = runner.run_node(_node(), select(GPU_QUERY_CHECKS), "r1", t)
    assert len(parses) == 1 and {r.check for r in rows} == set(GPU_QUERY_CHECKS.split(","))
    # Cut mid-document: each check reports the same parse error row, parsed once per node.
    parses.clear()
    for name in ("n1", "n2"):
        t = ScriptedTransport(name, {("nvidia-smi", "-q", "-x"): _out(xml[: len(xml) // 2])})
        rows = runner.run_node(_node(name), select(GPU_QUERY_CHECKS), "r1", t)
        assert {r.check for r in rows} == set(GPU_QUERY_CHECKS.split(","))
        assert {(r.status, r.code) for r in rows} == {(Status.ERROR, "tool.parse_error")}
        assert len({r.detail for r in rows}) == 1
    assert len(parses) == 2


def test_driver_not_loaded_capture_fails_gpu_checks(fixtures_dir: Path) -> None:
    text = (
        fixtures_dir / "nvidia-smi-nodriver/nvidia-smi-535.261.03-debian12-no-driver-rc9.txt"
    ).read_text()
    t = ScriptedTransport("n1", {("nvidia-smi",): _out(text, rc=9)})
    rows = runner.run_node(_node(), select("gpu.driver,gpu.count,gpu.topology"), "r1", t)
    assert {(r.check, r.status, r.code) for r in rows} == {
        (c, Status.FAIL, "gpu.driver.not_loaded")
        for c in ("gpu.driver", "gpu.count", "gpu.topology")
    }
    assert exit_code_for([r.status for r in rows], [r.code for r in rows]) is (
        ExitCode.CHECK_FAILED
    )


def test_tool_failures_become_error_rows_with_codes() -> None:
    t = ScriptedTransport(
        "n1",
        {
            ("nvidia-smi", "-q", "-x"): lambda a: CommandResult(a, -1, "", "", 60.0, True),
            ("nvidia-smi", "topo"): _out("this is not a topology matrix\n"),
            ("ibstat",): _out("this is not ibstat output\n"),
            ("systemctl",): _out("", rc=1),
            ("journalctl",): lambda a: CommandResult(a, -1, "x" * 4096, "", 1.0, False, True),
        },
    )
    rows = runner.run_node(
        _node(), select("gpu.count,gpu.topology,node.services,fabric.ib,gpu.xid,nccl.*"), "r1", t
    )
    codes = {r.check: (r.status, r.code) for r in rows}
    assert codes == {
        "gpu.count": (Status.ERROR, "tool.timeout"),
        # nvidia-smi timed out once on this node: topo -m is not started at all
        "gpu.topology": (Status.ERROR, "tool.timeout"),
        "node.services": (Status.ERROR, "tool.exit_nonzero"),
        "fabric.ib": (Status.ERROR, "tool.parse_error"),
        "gpu.xid": (Status.ERROR, "tool.output_too_large"),
        "nccl.allreduce": (Status.ERROR, "tool.not_found"),
    }
    assert ("nvidia-smi", "topo", "-m") not in t.calls
    topo = next(r for r in rows if r.check == "gpu.topology")
    assert topo.detail.startswith("not started: nvidia-smi already timed out on this node")
    assert exit_code_for([r.status for r in rows], [r.code for r in rows]) is (
        ExitCode.USAGE_OR_TOOL_ERROR
    )


class _Boom(Check):
    id = "test.boom"
    title = "raises"

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        raise RuntimeError("bug")


class _Gone(ScriptedTransport):
    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        raise Unreachable(self.host, "127.0.1.16:22: timed out")


def test_check_bug_and_unreachable_host_keep_every_row() -> None:
    rows = runner.run_node(
        _node(), [_Boom(), *select("gpu.count")], "r1", ScriptedTransport("n1", {})
    )
    assert rows[0].code == "check.internal_error" and "RuntimeError: bug" in rows[0].detail
    assert rows[1].code == "tool.not_found"
    checks = select(None)
    gone = runner.run_node(_node(), checks, "r1", _Gone("n1", {}))
    assert [r.check for r in gone] == [c.id for c in checks]
    assert {(r.status, r.code) for r in gone} == {(Status.ERROR, "host.unreachable")}
    assert exit_code_for([r.status for r in gone], [r.code for r in gone]) is (ExitCode.UNREACHABLE)


class _Concurrent(ScriptedTransport):
    """Says it may run two commands at once (as SSHTransport does), so gpu.xid's journalctl
    starts with the node; systemctl finds the connection gone."""

    concurrent_runs = True

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        if argv[0] == "systemctl":
            self.calls.append(tuple(argv))
            raise Unresponsive(self.host, "cannot start systemctl: [Errno 32] Broken pipe")
        return super().run(argv, timeout)


def test_a_prefetched_answer_outlives_the_connection(fixtures_dir: Path) -> None:
    """The node goes away at its first check. The checks after it get that check's row without
    asking the node again, except gpu.xid, whose journalctl ran beside it: its own answer
    (here a real Xid 63 line) is reported, not the connection's end."""
    journal = (fixtures_dir / "dmesg-xid/xid63-row-remapper-new-row-marked.txt").read_text()
    t = _Concurrent("n1", {("journalctl",): _out(journal)})
    rows = runner.run_node(_node(), select("node.services,gpu.count,gpu.xid"), "r1", t)
    by_check = {r.check: r for r in rows}
    assert [r.check for r in rows] == ["node.services", "gpu.count", "gpu.xid"]
    for check in ("node.services", "gpu.count"):
        assert (by_check[check].status, by_check[check].code) == (Status.ERROR,
                                                                  "host.unresponsive")
        assert "Broken pipe" in by_check[check].detail
    assert (by_check["gpu.xid"].metric, by_check["gpu.xid"].code) == ("xid_63", "gpu.xid.63")
    # nvidia-smi was never started after the connection went
    assert sorted(c[0] for c in t.calls) == ["journalctl", "systemctl"]


def test_profile_error_is_a_row_not_a_crash() -> None:
    rows = runner.run_node(
        _node(profile="no-such-sku"), select("gpu.count"), "r1", ScriptedTransport("n1", {})
    )
    assert (rows[0].status, rows[0].code) == (Status.ERROR, "profile.invalid")
    assert "no-such-sku.yml" in rows[0].detail


def test_nodes_run_in_parallel_and_report_progress() -> None:
    nodes = [_node(f"n{i}") for i in range(8)]
    seen: list[runner.NodeOutcome] = []
    transports: list[ScriptedTransport] = []
    lock = threading.Lock()
    # Eight nodes must be inside their first command at the same time, or the barrier breaks
    # (after 10 s) and every check becomes an internal-error row: concurrency by a barrier,
    # not by the clock.
    barrier = threading.Barrier(8, timeout=10)

    def factory(node: Node) -> ScriptedTransport:
        t = ScriptedTransport(node.name, {("systemctl",): _out("active\n" * 4)})
        t.barrier = barrier
        with lock:
            transports.append(t)
        return t

    done: list[str] = []
    rows = runner.run(
        nodes,
        select("node.services"),
        run_id="r1",
        transport_for=factory,
        concurrency=8,
        progress=seen.append,
        on_node_done=lambda node, node_rows: done.append(node.name),
    )
    assert not barrier.broken
    assert [r.node for r in rows] == [n.name for n in nodes]
    assert sorted(o.done for o in seen) == list(range(1, 9))
    assert sorted(done) == sorted(n.name for n in nodes)
    assert all(t.closed for t in transports)
    assert all(r.status is Status.PASS for r in rows)


def test_concurrency_limit_holds() -> None:
    """With concurrency 3, a fourth node never joins the first three (a 4-party barrier
    breaks), and every node still runs."""
    barrier = threading.Barrier(4, timeout=1)
    broken: list[str] = []

    class Waiting(ScriptedTransport):
        def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                broken.append(self.host)
            return super().run(argv, timeout)

    rows = runner.run(
        [_node(f"n{i}") for i in range(6)], select("node.services"), run_id="r1",
        transport_for=lambda n: Waiting(n.name, {("systemctl",): _out("active\n" * 4)}),
        concurrency=3,
    )
    assert len(broken) == 6 and {r.node for r in rows} == {f"n{i}" for i in range(6)}


# ---------------------------------------------------------------- storage, for real


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_mode, p.stat().st_size)
        for p in sorted(root.rglob("*"))
    }


def _fake_fio(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "fio"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture()
def scratch(tmp_path: Path) -> Path:
    d = tmp_path / "scratch"
    d.mkdir()
    (d / "someone-elses-file").write_text("keep me")
    return d


def _local(bin_dir: Path) -> LocalTransport:
    return LocalTransport("n1", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})


def test_fio_writes_only_its_own_subdir_and_cleans_up(
    fixtures_dir: Path, scratch: Path, tmp_path: Path
) -> None:
    capture = (
        fixtures_dir / "fio/fio-3.33-json-seqwrite-seqread-randread4k-3jobs-stonewall-vm-disk.json"
    )
    args_log = tmp_path / "fio-args"
    # Stand-in for fio: records its argv, writes the file it was pointed at, prints the real
    # fio 3.33 JSON capture.
    _fake_fio(
        tmp_path / "bin",
        f'printf "%s\\n" "$@" > {args_log}\n'
        'for a in "$@"; do case "$a" in --filename=*) f="${a#--filename=}";; esac; done\n'
        f'head -c 4096 /dev/zero > "$f"\ncat {capture}\n',
    )
    before = _tree(scratch)
    node = _node(
        gpuready_scratch_path=str(scratch), gpuready_drive_class="virtual", gpuready_fio_size_mib=1
    )
    rows = runner.run_node(node, select("storage.fio"), "r1", _local(tmp_path / "bin"))
    assert {r.metric: r.status for r in rows} == {
        "seq_write_mibps": Status.PASS,
        "seq_read_mibps": Status.PASS,
        "randread_4k_iops": Status.PASS,
    }
    args = args_log.read_text().splitlines()
    filename = next(a for a in args if a.startswith("--filename="))[len("--filename=") :]
    assert filename.startswith(f"{scratch}/gpuready-fio-r1-") and "--size=1M" in args
    assert "--output-format=json" in args
    assert _tree(scratch) == before


def test_killed_fio_still_leaves_nothing_behind(scratch: Path, tmp_path: Path) -> None:
    _fake_fio(
        tmp_path / "bin",
        'for a in "$@"; do case "$a" in --filename=*) f="${a#--filename=}";; esac; done\n'
        'head -c 4096 /dev/zero > "$f"\nsleep 30\n',
    )
    before = _tree(scratch)
    node = _node(
        gpuready_scratch_path=str(scratch),
        gpuready_fio_size_mib=1,
        gpu_thresholds={"fio": {"timeout_s": 1}},
    )
    start = time.monotonic()
    rows = runner.run_node(node, select("storage.fio"), "r1", _local(tmp_path / "bin"))
    assert time.monotonic() - start < 10
    assert (rows[0].status, rows[0].code) == (Status.ERROR, "tool.timeout")
    assert _tree(scratch) == before


def test_checkpoint_for_real_and_refusals(scratch: Path, tmp_path: Path) -> None:
    before = _tree(scratch)
    node = _node(gpuready_checkpoint_path=str(scratch), gpuready_checkpoint_size_mib=8)
    rows = runner.run_node(node, select("storage.checkpoint"), "r1", LocalTransport())
    assert [r.metric for r in rows] == ["write_gbps", "read_gbps"]
    assert all(r.value is not None and r.value > 0 and r.unit == "GB/s" for r in rows)
    assert _tree(scratch) == before
    link = tmp_path / "link"
    link.symlink_to(scratch)
    refused = runner.run_node(
        _node(gpuready_checkpoint_path=str(link)),
        select("storage.checkpoint"),
        "r1",
        LocalTransport(),
    )
    assert refused[0].code == "storage.path_refused"
    full = runner.run_node(
        _node(gpuready_checkpoint_path=str(scratch), gpuready_checkpoint_size_mib=2**30),
        select("storage.checkpoint"),
        "r1",
        LocalTransport(),
    )
    assert (full[0].status, full[0].code) == (Status.FAIL, "storage.no_space")
    assert _tree(scratch) == before


@pytest.mark.parametrize("before", [(700, 10, 10), (0, 10, 10)], ids=["default", "off"])
def test_the_fan_out_collects_less_and_puts_the_threshold_back(before: tuple[int, int, int]
                                                               ) -> None:
    """During the fan-out the collector's first threshold is raised (it ran ~14 times per node
    on nvidia-smi's XML); after it, the caller's setting is back. 0 (collection off) stays 0."""
    seen: list[tuple[int, int, int]] = []

    class Recording(ScriptedTransport):
        def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
            seen.append(gc.get_threshold())
            return super().run(argv, timeout)

    saved = gc.get_threshold()
    gc.set_threshold(*before)
    try:
        runner.run([_node()], select("node.services"), run_id="r1",
                   transport_for=lambda n: Recording(n.name, {("systemctl",): _out("active\n")}))
        after = gc.get_threshold()
    finally:
        gc.set_threshold(*saved)
    assert seen and seen[0] == ((20_000, 10, 10) if before[0] else before)
    assert after == before
