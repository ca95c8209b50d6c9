"""fabric.nccl_pair: the suspect/confirm plan, the pool's settings, the mpirun command line,
what a pair run's output means (real multi-node captures), and the run-key scripts run in a
real shell. The whole check on six nodes runs with each node a local shell of its own (its own
HOME, so its own authorized_keys) answering mpirun with real captures.
"""

from __future__ import annotations

import random
import shutil
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from validate import fabric
from validate.fabric import PairRun, first_pass, second_pass, triage, verdicts
from validate.fabric_launch import (
    LAUNCHER_CLEANUP,
    LAUNCHER_SETUP,
    PEER_INSTALL,
    PEER_REMOVE,
    LaunchError,
    PairSettings,
    judge_output,
    key_tag,
    known_hosts_lines,
    launch_argv,
    mpirun_argv,
    remote_argv,
)
from validate.inventory import InventoryError, Node
from validate.model import Status
from validate.profiles import Band, load_profile
from validate.transport import CommandResult
from validate.transport.local import LocalTransport

A100_2NODE = "nccl-tests/all_reduce_perf-16x-a100-sxm4-80gb-2-node-nccl2.12.12.txt"
H200_2NODE = "nccl-tests/all_reduce_perf-2node-2x-h200-k8s-mpi-operator-1K-8G.txt"
SINGLE_NODE = "nccl-tests/all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt"
NOT_ENOUGH_SLOTS = "nccl-tests/all_reduce_perf-mpirun-not-enough-slots-failure.txt"
CORRUPTION_4NODE = ("nccl-tests-multinode/all_reduce_perf-4node-16x-gh200-slingshot-ofi-ll128-"
                    "data-corruption-wrong-nonzero.txt")


def _node(name: str, pool: str = "pool_a100", profile: str = "a100-sxm4-80gb-8x",
          fabric_kind: str = "infiniband", **vars_: object) -> Node:
    return Node(name=name, address=f"10.0.0.{name[-1]}", port=22, user="root",
                connection="ssh", key_file=None, known_hosts=None,
                accept_unknown_host_keys=False, pool=pool, profile=profile,
                gpu_pool={"fabric": fabric_kind}, vars=dict(vars_))


def _run(pass_no: int, a: str, b: str, status: Status, blame: str | None = None,
         busbw: float | None = None) -> PairRun:
    code = {Status.PASS: "ok", Status.FAIL: "fabric.nccl_pair.low_busbw"}.get(
        status, "tool.timeout")
    return PairRun(pass_no, "p", a, b, status, code, busbw, f"{a}+{b}", blame, 1.0, "t")


# -- the plan -------------------------------------------------------------------------------


def test_first_pass_pairs_neighbours_and_leaves_the_odd_one_out():
    assert first_pass(["n1", "n2", "n3", "n4"]) == ([("n1", "n2"), ("n3", "n4")], [])
    assert first_pass(["n1", "n2", "n3"]) == ([("n1", "n2")], ["n3"])
    assert first_pass(["n1"]) == ([], ["n1"])


def test_second_pass_uses_each_good_node_once_per_round():
    assert second_pass(["s1", "s2", "s3"], ["g1", "g2"]) == [
        [("g1", "s1"), ("g2", "s2")], [("g1", "s3")]]
    assert second_pass(["s1"], []) == []


def test_the_issue_example_six_nodes_one_degraded():
    names = [f"node{i}" for i in range(1, 7)]
    first = [_run(1, "node1", "node2", Status.PASS, busbw=480),
             _run(1, "node3", "node4", Status.FAIL, busbw=240),
             _run(1, "node5", "node6", Status.PASS, busbw=481)]
    tri = triage(names, first, [])
    assert tri.good == ("node1", "node2", "node5", "node6")
    assert tri.retest == ("node3", "node4") and tri.own_errors == ()
    assert second_pass(tri.retest, tri.good) == [[("node1", "node3"), ("node2", "node4")]]
    second = [_run(2, "node1", "node3", Status.PASS, busbw=479),
              _run(2, "node2", "node4", Status.FAIL, busbw=239)]
    v = verdicts(names, first, second, [])
    assert {n: v[n].status for n in names} == {
        "node1": Status.PASS, "node2": Status.PASS, "node3": Status.PASS,
        "node4": Status.FAIL, "node5": Status.PASS, "node6": Status.PASS}
    assert v["node4"].busbw_gbps == 239 and "confirmed" in v["node4"].detail
    assert "node2" in v["node4"].detail and "node3" in v["node4"].detail  # both of its pairs
    assert v["node3"].busbw_gbps == 479 and "cleared with node1" in v["node3"].detail
    assert "node4's" in v["node3"].detail


def test_errors_are_a_nodes_own_or_retested():
    names = ["n1", "n2", "n3", "n4", "n5", "n6", "n7"]
    first = [_run(1, "n1", "n2", Status.PASS),
             _run(1, "n3", "n4", Status.ERROR, blame="n3"),  # n3: no mpirun
             _run(1, "n5", "n6", Status.ERROR)]  # a hang: whose?
    tri = triage(names, first, ["n7"])
    assert tri.own_errors == ("n3",)
    assert tri.retest == ("n4", "n5", "n6", "n7")
    rounds = second_pass(tri.retest, tri.good)
    assert rounds == [[("n1", "n4"), ("n2", "n5")], [("n1", "n6"), ("n2", "n7")]]
    second = [_run(2, "n1", "n4", Status.PASS), _run(2, "n2", "n5", Status.PASS),
              _run(2, "n1", "n6", Status.ERROR), _run(2, "n2", "n7", Status.ERROR, blame="n2")]
    v = verdicts(names, first, second, ["n7"])
    assert v["n3"].status is Status.ERROR and "own" in v["n3"].detail
    assert v["n4"].status is Status.PASS and v["n5"].status is Status.PASS
    assert v["n6"].status is Status.ERROR and v["n6"].code == "tool.timeout"
    assert "n5-n6" in v["n6"].detail and "n1-n6" in v["n6"].detail  # names its pairs
    assert v["n7"].code == fabric.CODE_UNRESOLVED  # its known-good partner broke


def test_without_a_good_node_nothing_is_invented():
    v = verdicts(["a", "b"], [_run(1, "a", "b", Status.FAIL, busbw=100)], [], [])
    assert {x.status for x in v.values()} == {Status.FAIL}
    assert all("unconfirmed" in x.detail for x in v.values())
    v = verdicts(["a", "b", "c"], [_run(1, "a", "b", Status.ERROR, blame="b")], [], ["c"])
    assert v["b"].status is Status.ERROR and v["a"].code == fabric.CODE_UNRESOLVED
    assert v["c"].code == fabric.CODE_UNRESOLVED and "odd one out" in v["c"].detail


@pytest.mark.parametrize("seed", range(40))
def test_suspect_confirm_finds_exactly_the_bad_nodes_in_linear_runs(seed: int):
    rng = random.Random(seed)
    n = rng.randint(2, 64)
    names = [f"n{i:02d}" for i in range(n)]
    bad = set(rng.sample(names, rng.randint(0, max(0, n // 4))))

    def measure(pass_no: int, a: str, b: str) -> PairRun:
        # The fault model: a pair is slow when either node has a bad rail.
        return _run(pass_no, a, b, Status.FAIL if {a, b} & bad else Status.PASS)

    pairs, leftover = first_pass(names)
    first = [measure(1, a, b) for a, b in pairs]
    tri = triage(names, first, leftover)
    second = [measure(2, a, b) for rnd in second_pass(tri.retest, tri.good) for a, b in rnd]
    v = verdicts(names, first, second, leftover)
    runs = len(first) + len(second)
    assert runs <= n // 2 + 2 * len(bad) + 1  # O(n): each suspect costs one more run
    if tri.good:
        assert {x for x in names if v[x].status is Status.FAIL} == bad
        assert all(v[x].status is Status.PASS for x in names if x not in bad)
    else:  # no pair passed: every node is held back, none is called good
        assert all(v[x].status is not Status.PASS for x in names)


# -- settings from the profile and the inventory ----------------------------------------------


def test_settings_from_profile_and_pool_variables():
    profile = load_profile("h100-sxm5-80gb-8x")
    node = _node("n1", profile="h100-sxm5-80gb-8x", gpuready_fabric_nccl_ib_hca="=mlx5_0,mlx5_1",
                 gpuready_fabric_nccl_ib_gid_index=3, gpuready_fabric_nccl_socket_ifname="eth0",
                 gpuready_fabric_nccl_env={"NCCL_DEBUG": "WARN", "UCX_TLS": "rc"},
                 gpuready_fabric_mpi_mca={"btl_tcp_if_include": "10.0.0.0/24"})
    s = fabric.pair_settings(node, profile)
    assert isinstance(s, PairSettings)
    assert (s.gpus, s.size_bytes, s.timeout_s) == (8, 8589934592, 600.0)
    assert s.band == Band(440.0, 400.0, "higher")
    assert dict(s.nccl_env) == {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": "3",
                                "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN",
                                "UCX_TLS": "rc"}
    assert dict(s.mca) == {"btl_tcp_if_include": "10.0.0.0/24"}
    # The pool's timeout and band come from the inventory's gpu_thresholds like any other.
    tuned = load_profile("h100-sxm5-80gb-8x", {"nccl_pair": {"timeout_s": 30}})
    assert fabric.pair_settings(node, tuned).timeout_s == 30.0  # type: ignore[union-attr]


def test_pools_without_an_rdma_fabric_are_skipped():
    ethernet = _node("n1", fabric_kind="ethernet")
    a100 = load_profile("a100-sxm4-80gb-8x")
    assert "no RDMA fabric" in str(fabric.pair_settings(ethernet, a100))
    l40s = _node("n1", profile="l40s-pcie-48gb-4x")
    assert "no RDMA NICs" in str(fabric.pair_settings(l40s, load_profile("l40s-pcie-48gb-4x")))


@pytest.mark.parametrize(("vars_", "message"), [
    ({"gpuready_fabric_nccl_ib_gid_index": "3"}, "gpuready_fabric_nccl_ib_gid_index is '3', "
     "not a non-negative integer"),
    ({"gpuready_fabric_nccl_ib_gid_index": True}, "not a non-negative integer"),
    ({"gpuready_fabric_nccl_ib_hca": "mlx5_0, mlx5_1"}, "without blanks"),
    ({"gpuready_fabric_nccl_env": ["NCCL_DEBUG=INFO"]}, "gpuready_fabric_nccl_env is a list "),
    ({"gpuready_fabric_nccl_env": {"nccl_debug": "INFO"}}, "'nccl_debug' is not an "
     "environment variable name"),
    ({"gpuready_fabric_nccl_env": {"NCCL_IB_HCA": "mlx5"}}, "set it with "
     "gpuready_fabric_nccl_ib_hca"),
    ({"gpuready_fabric_nccl_env": {"NCCL_DEBUG": "a\nb"}}, "not one non-empty line"),
    ({"gpuready_fabric_mpi_mca": {"plm_rsh_args": "-p 2222"}}, "set by the pair launch"),
    ({"gpuready_fabric_mpi_mca": {"BTL": "tcp"}}, "not an MCA parameter name"),
])
def test_bad_inventory_variables_name_what_is_wrong(vars_: dict[str, object], message: str):
    # A wrong type is refused when the node's declared state is read (here: building the
    # Node); a name the pair launch cannot take, when its settings are.
    with pytest.raises(InventoryError, match="host gpu-7: .*" + message.split("'", maxsplit=1)[0]):
        fabric.pair_settings(_node("gpu-7", **vars_), load_profile("a100-sxm4-80gb-8x"))


def test_mpirun_command_line():
    settings = PairSettings(8, 1 << 30, 20, 5, 300.0, Band(168, 155),
                            (("NCCL_IB_HCA", "=mlx5_0"),), (("btl_tcp_if_include", "lo"),))
    peer = replace(_node("gpu-2"), port=2222, user="gpuready")
    argv = mpirun_argv(settings, "gpu-1.example", peer, "/tmp/gpuready-fabric.x", True)
    assert argv[:5] == ["timeout", "-k", "5", "300", "mpirun"]
    host = argv.index("--host")
    assert argv[host + 1] == "gpu-1.example:1,10.0.0.2:1"
    rsh = argv[argv.index("plm_rsh_args") + 1]
    assert "-i /tmp/gpuready-fabric.x/id_ed25519" in rsh and "IdentitiesOnly=yes" in rsh
    assert "StrictHostKeyChecking=yes" in rsh and "UserKnownHostsFile=/tmp/gpuready-fabric.x/" \
        "known_hosts" in rsh
    assert f"-p {peer.port} -l {peer.user}" in rsh
    assert argv[argv.index("btl_tcp_if_include") + 1] == "lo"
    assert "NCCL_IB_HCA==mlx5_0" in argv
    assert argv[argv.index("all_reduce_perf"):] == [
        "all_reduce_perf", "-b", "1073741824", "-e", "1073741824", "-f", "2", "-g", "8", "-c",
        "1", "-n", "20", "-w", "5"]
    assert "accept-new" in " ".join(mpirun_argv(settings, "h", peer, "/tmp/d", False))
    with pytest.raises(LaunchError, match="blanks"):
        mpirun_argv(settings, "h", _node("gpu-3"), "/tmp/with space", True)


# -- what a pair run says (real captures) --------------------------------------------------------

A100 = PairSettings(8, 1 << 30, 20, 5, 600.0, Band(168, 155))
H100 = PairSettings(8, 8 << 30, 20, 5, 600.0, Band(440, 400))


def _result(text: str, rc: int = 0, stderr: str = "") -> CommandResult:
    return CommandResult(("mpirun",), rc, text, stderr, 1.0)


def test_real_two_node_runs_are_judged_against_the_pools_band(fixtures_dir: Path):
    a100 = (fixtures_dir / A100_2NODE).read_text()
    v = judge_output(_result(a100), A100, "n1", "n2")
    assert (v.status, v.code, v.busbw_gbps) == (Status.PASS, "ok", 182.80)
    assert "16 ranks on {host1} + {host2}" in v.detail
    v = judge_output(_result(a100), H100, "n1", "n2")
    assert (v.status, v.code) == (Status.FAIL, "fabric.nccl_pair.low_busbw")
    assert "below 400" in v.detail
    h200 = judge_output(_result((fixtures_dir / H200_2NODE).read_text()), A100, "n1", "n2")
    assert (h200.status, h200.busbw_gbps) == (Status.FAIL, 31.89)


def test_outputs_that_are_not_a_pair_measurement(fixtures_dir: Path):
    single = judge_output(_result((fixtures_dir / SINGLE_NODE).read_text()), A100, "n1", "n2")
    assert (single.status, single.code) == (Status.ERROR, "fabric.nccl_pair.not_multinode")
    slots = judge_output(_result((fixtures_dir / NOT_ENOUGH_SLOTS).read_text(), rc=1), A100,
                         "n1", "n2")
    assert slots.status is Status.ERROR and "not enough slots" in slots.detail
    # A published block cut after the last row has no summary: not a complete run.
    cut = judge_output(_result((fixtures_dir / CORRUPTION_4NODE).read_text()), A100, "n1", "n2")
    assert cut.status is Status.ERROR and cut.blame is None


def test_missing_mpirun_and_a_hang_really_happen(tmp_path: Path):
    # A launcher whose PATH has no mpirun: the wrapper and GNU timeout answer as on a node.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "timeout", "sleep"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    local = LocalTransport("n1", env={"PATH": str(bin_dir), "LC_ALL": "C"})
    run_dir = tmp_path / "gpuready-fabric.t"
    run_dir.mkdir()
    argv = launch_argv(str(run_dir), mpirun_argv(A100, "n1", _node("n2"), str(run_dir), True))
    missing = local.run(argv, 20)
    assert missing.rc == 127 and "mpirun" in missing.stderr
    v = judge_output(missing, A100, "n1", "n2")
    assert (v.code, v.blame) == ("tool.not_found", "n1")
    assert (run_dir / "mpirun.pid").read_text().strip().isdigit()
    hung = local.run(["timeout", "-k", "1", "1", "sleep", "30"], 20)
    v = judge_output(hung, A100, "n1", "n2")
    assert (v.status, v.code, v.blame) == (Status.ERROR, "tool.timeout", None)
    assert "n1-n2" in v.detail


# -- the run-key scripts in a real shell -----------------------------------------------------------

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvMhRVOy7Nk0XwTmSMgT7M5TyUm3Yc6Cc1ZqyrYEzFx"


def _shell(home: Path) -> LocalTransport:
    return LocalTransport("n", env={"HOME": str(home), "LC_ALL": "C"})


@pytest.mark.parametrize("before", [
    "ssh-ed25519 AAAAadmin admin@site\n",
    "ssh-ed25519 AAAAadmin admin@site",  # no newline at the end
    "",
])
def test_install_then_remove_leaves_authorized_keys_as_it_was(tmp_path: Path, before: str):
    ssh_dir = tmp_path / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(before)
    keys.chmod(0o640)
    tag = key_tag("20261202T000000Z", "n1")
    shell = _shell(tmp_path)
    got = shell.run(remote_argv(PEER_INSTALL, f"{PUB} {tag}", "600", "10.0.0.1"), 10)
    assert got.ok, got.stderr
    lines = keys.read_text().splitlines()
    assert lines[:-1] == before.splitlines()  # every key that was there stays, whole
    expiry = time.strftime("%Y%m%d%H%M", time.localtime(time.time() + 600))
    assert lines[-1] in (f'from="10.0.0.1",expiry-time="{expiry}",restrict {PUB} {tag}',
                         f'from="10.0.0.1",expiry-time="{int(expiry) - 1}",restrict {PUB} {tag}')
    assert shell.run(remote_argv(PEER_REMOVE, tag), 10).ok
    assert keys.read_text() == (before + "\n" if before and not before.endswith("\n") else before)
    assert stat.S_IMODE(keys.stat().st_mode) == 0o640
    assert [p.name for p in ssh_dir.iterdir()] == ["authorized_keys"]  # no temp file left


def test_remove_keeps_other_runs_and_symlinks(tmp_path: Path):
    ssh_dir = tmp_path / ".ssh"
    ssh_dir.mkdir()
    real = tmp_path / "managed_keys"
    (ssh_dir / "authorized_keys").symlink_to(real)
    other_run = f"{PUB} {key_tag('other-run', 'n1')}\n"
    mine = [f"{PUB} {key_tag('run', 'node1')}\n", f"{PUB} {key_tag('run', 'node10')}\n"]
    real.write_text("ssh-ed25519 AAAAadmin admin\n" + other_run + "".join(mine))
    shell = _shell(tmp_path)
    # node1's tag must not take node10's key with it.
    assert shell.run(remote_argv(PEER_REMOVE, key_tag("run", "node1")), 10).ok
    assert real.read_text() == "ssh-ed25519 AAAAadmin admin\n" + other_run + mine[1]
    assert shell.run(remote_argv(PEER_REMOVE, key_tag("run")), 10).ok  # the run's sweep
    assert real.read_text() == "ssh-ed25519 AAAAadmin admin\n" + other_run
    assert (ssh_dir / "authorized_keys").is_symlink()
    mtime = real.stat().st_mtime_ns
    assert shell.run(remote_argv(PEER_REMOVE, key_tag("run")), 10).ok
    assert real.stat().st_mtime_ns == mtime  # nothing to remove: the file is not rewritten


def test_launcher_setup_and_cleanup(tmp_path: Path):
    shell = _shell(tmp_path)
    run_dir = tmp_path / "gpuready-fabric.run.p1.n1.n2"
    tag = key_tag("run", "n1")
    out = shell.run(remote_argv(LAUNCHER_SETUP, tag, "127.0.0.1",
                                "127.0.0.1 ssh-ed25519 AAAAhost", str(run_dir)), 30)
    assert out.ok, out.stderr
    info = fabric.parse_launcher_setup(out, "n1")
    assert info.run_dir == str(run_dir) and info.source_address == "127.0.0.1"
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, check=True)
    assert info.hostname == hostname.stdout.strip()
    assert info.public_key.startswith("ssh-ed25519 ") and info.public_key.endswith(tag)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run_dir / "id_ed25519").stat().st_mode) == 0o600
    assert (run_dir / "known_hosts").read_text() == "127.0.0.1 ssh-ed25519 AAAAhost\n"
    # A directory that exists already (made by someone else) is refused, not reused.
    again = shell.run(remote_argv(LAUNCHER_SETUP, tag, "127.0.0.1", "", str(run_dir)), 30)
    with pytest.raises(LaunchError) as err:
        fabric.parse_launcher_setup(again, "n1")
    assert err.value.blame == "n1"
    # A pid file whose process no longer names the directory (it ended, the number was
    # reused) is not signalled.
    stranger = subprocess.Popen(["sleep", "60"])
    (run_dir / "mpirun.pid").write_text(f"{stranger.pid}\n")
    try:
        assert shell.run(remote_argv(LAUNCHER_CLEANUP, str(run_dir), "1"), 10).ok
        assert stranger.poll() is None and not run_dir.exists()
    finally:
        stranger.kill()
        stranger.wait()
    refused = shell.run(remote_argv(LAUNCHER_CLEANUP, str(tmp_path)), 10)
    assert refused.rc == 2 and tmp_path.exists()


@pytest.mark.parametrize("kill_after", ["1", "30"], ids=["timeout-kills", "cleanup-kills"])
def test_launcher_cleanup_returns_only_once_the_pair_is_gone(tmp_path: Path, kill_after: str):
    # The launch as the validator makes it: the wrapper records the pid, `timeout` leads the
    # group, and "mpirun" (a shell that ignores TERM, naming the run's key as mpirun does)
    # runs under it. Whether timeout's own KILL or the cleanup's ends it, nothing of the pair
    # may still run when the cleanup returns: an interrupted run is judged the moment it ends.
    run_dir = tmp_path / "gpuready-fabric.run.p1.n1.n2"
    run_dir.mkdir()
    standin = ["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done", "mpirun",
               "-i", f"{run_dir}/id_ed25519"]
    launched = subprocess.Popen(
        launch_argv(str(run_dir), ["timeout", "-k", kill_after, "600", *standin]))
    try:
        deadline = time.monotonic() + 10
        while not (run_dir / "mpirun.pid").exists() or _group(launched.pid) == []:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        shell = _shell(tmp_path)
        started = time.monotonic()
        assert shell.run(remote_argv(LAUNCHER_CLEANUP, str(run_dir), "3"), 20).ok
        assert time.monotonic() - started < 10
        assert _group(launched.pid) == [] and not run_dir.exists()
    finally:
        for pid in _group(launched.pid):
            subprocess.run(["kill", "-KILL", pid], check=False)
        launched.wait(timeout=10)


def _group(pgid: int) -> list[str]:
    """The live (not zombie) members of the process group."""
    out = subprocess.run(["pgrep", "-g", str(pgid)], check=False, capture_output=True, text=True)
    return [p for p in out.stdout.split() if _alive(p)]


def _alive(pid: str) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_peer_remove_stops_only_this_runs_daemons(tmp_path: Path):
    # Two "orted"s (scripts by that name that ignore TERM and have a child, as orted has its
    # rank): one launched for this run, one for another run. The run's sweep stops its own,
    # child included, and leaves the other alone.
    orted = tmp_path / "orted"
    orted.write_text("#!/bin/sh\ntrap '' TERM\nsleep 600 &\nwhile :; do sleep 0.1; done\n")
    orted.chmod(0o755)
    mine = subprocess.Popen([str(orted), "-mca", "plm_rsh_args",
                             "-i /tmp/gpuready-fabric.run.p1.n1.n2/id_ed25519"])
    other = subprocess.Popen([str(orted), "-mca", "plm_rsh_args",
                              "-i /tmp/gpuready-fabric.run2.p1.n1.n2/id_ed25519"])
    try:
        deadline = time.monotonic() + 10
        while not _children(mine.pid):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child = _children(mine.pid)
        shell = _shell(tmp_path)
        got = shell.run(remote_argv(PEER_REMOVE, key_tag("run"), "/tmp/gpuready-fabric.run.",
                                    "1"), 20)
        assert got.ok, got.stderr
        assert mine.wait(timeout=5) == -9
        assert not any(_alive(pid) for pid in child)
        assert other.poll() is None
    finally:
        for proc in (mine, other):
            for pid in _children(proc.pid):
                subprocess.run(["kill", "-KILL", pid], check=False)
            proc.kill()
            proc.wait()


def _children(pid: int) -> list[str]:
    """The children of ``pid`` that are the stand-in rank (``sleep 600``)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], check=False, capture_output=True, text=True)
    return [p for p in out.stdout.split() if "sleep 600" in _cmdline(p)]


def _cmdline(pid: str) -> str:
    """``pid``'s command line; empty once it has exited (the loop's ``sleep 0.1`` children
    come and go between pgrep and this read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace").replace("\0", " ")
    except OSError:
        return ""


def test_peer_host_keys_come_from_the_verified_known_hosts(tmp_path: Path):
    key = tmp_path / "hostkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    keytype, data = key.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"10.0.0.2 {keytype} {data}\n[10.0.0.3]:2222 {keytype} {data}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True,
                   capture_output=True)  # hashed names, as many sites keep them
    assert "10.0.0.2" not in known.read_text()
    peer = replace(_node("gpu-2"), known_hosts=known)
    assert known_hosts_lines(peer) == [f"10.0.0.2 {keytype} {data}"]
    other = replace(peer, address="10.0.0.3", port=2222)
    assert known_hosts_lines(other) == [f"[10.0.0.3]:2222 {keytype} {data}"]
    assert known_hosts_lines(replace(peer, address="10.0.0.9")) == []



# -- the whole check, each node a local shell of its own -------------------------------------------


class ShellNode:
    """A node as a local shell with its own HOME (so its own ~/.ssh/authorized_keys): the
    run-key scripts run for real; the launch answers with a real 2-node capture, the slow one
    when the pair holds a node in ``slow``, so the test decides which nodes are bad, not what
    the check concludes."""

    def __init__(self, node: Node, home: Path, captures: dict[str, str], slow: set[str],
                 by_address: dict[str, str], calls: list[tuple[str, str]]) -> None:
        self._host = node.name
        self.shell = LocalTransport(node.name, env={"HOME": str(home), "LC_ALL": "C"})
        self.captures, self.slow, self.by_address, self.calls = captures, slow, by_address, calls

    @property
    def host(self) -> str:
        return self._host

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        if "mpirun" not in argv:
            return self.shell.run(argv, timeout)
        peer = self.by_address[argv[argv.index("--host") + 1].split(",")[1].split(":")[0]]
        self.calls.append((self._host, peer))
        text = self.captures["slow" if {self._host, peer} & self.slow else "fast"]
        return CommandResult(tuple(argv), 0, text, "", 0.5)

    def close(self) -> None:
        return None


def test_six_nodes_one_slow_rail_end_to_end(tmp_path: Path, fixtures_dir: Path):
    nodes = [replace(_node(f"node{i}"), address=f"127.0.0.{10 + i}") for i in range(1, 7)]
    homes = {n.name: tmp_path / n.name for n in nodes}
    for home in homes.values():
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAAadmin admin\n")
    captures = {"fast": (fixtures_dir / A100_2NODE).read_text(),  # 182.8 GB/s: passes
                "slow": (fixtures_dir / H200_2NODE).read_text()}  # 31.9 GB/s: fails
    calls: list[tuple[str, str]] = []
    by_address = {n.address: n.name for n in nodes}
    seen: list[PairRun] = []
    outcome = fabric.run_fabric(
        nodes, run_id="unit", accept_unknown_host_keys=True, progress=seen.append,
        transport_for=lambda n: ShellNode(n, homes[n.name], captures, {"node4"}, by_address,
                                          calls))
    # Pass 1 in parallel (any order), then each suspect with a node that passed.
    assert sorted(calls[:3]) == [("node1", "node2"), ("node3", "node4"), ("node5", "node6")]
    assert sorted(calls[3:]) == [("node1", "node3"), ("node2", "node4")]
    assert len(seen) == 5 and not outcome.interrupted
    status = {r.node: (r.status, r.code) for r in outcome.rows}
    assert status == {n.name: (Status.PASS, "ok") for n in nodes if n.name != "node4"} | {
        "node4": (Status.FAIL, "fabric.nccl_pair.low_busbw")}
    assert all(r.check == "fabric.nccl_pair" and r.metric == "busbw_gbps" for r in outcome.rows)
    assert {r.node: r.value for r in outcome.rows}["node4"] == 31.89
    # No run key and no run directory is left anywhere.
    for home in homes.values():
        assert (home / ".ssh" / "authorized_keys").read_text() == "ssh-ed25519 AAAAadmin admin\n"
    assert not list(Path("/tmp").glob("gpuready-fabric.unit.*"))
    assert outcome.leftovers == ()
    table = fabric.write_pair_table(tmp_path, outcome.runs)
    lines = table.read_text().splitlines()
    assert lines[0].startswith("pass,pool,launcher,peer,status,code,busbw_gbps")
    assert len(lines) == 6 and lines[-1].startswith("2,pool_a100,node2,node4,fail,")
