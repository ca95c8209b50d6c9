"""nccl-tests parser against every real capture in fixtures/nccl-tests and fixtures/nccl-warn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validate.parsers import ParseError, nccl
from validate.parsers.nccl import NcclDevice, NcclResult


def _read(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / "nccl-tests" / name).read_text()


# fixture -> (rows, devices, largest size, largest out-of-place busbw, largest in-place busbw,
#             largest #wrong, avg busbw)
GOLDEN = {
    "all_gather_perf-8x-a100-sxm4-40gb-old-format.txt": (
        34, 8, 8589934592, 223.39, 230.07, None, 58.2651,
    ),
    "all_reduce_perf-16x-a100-sxm4-80gb-2-node-nccl2.12.12.txt": (
        6, 16, 1073741824, 182.80, 181.39, 0, 150.209,
    ),
    "all_gather_perf-2node-2x-h200-gke-trailing-spaces-1K-8G.txt": (
        24, 2, 8589934592, 32.20, 33.32, 0, 15.0709,
    ),
    "all_reduce_perf-2node-2x-h200-k8s-mpi-operator-1K-8G.txt": (
        24, 2, 8589934592, 31.89, 31.88, 0, 15.5188,
    ),
    "all_reduce_perf-2node-k80-old-format-validation0.txt": (
        11, 2, 1073741824, 0.61, 0.61, None, 0.565546,
    ),
    "all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt": (
        6, 8, 1073741824, 231.72, 231.70, 0, 210.99,
    ),
    "alltoall_perf-8x-a100-sxm4-40gb-old-format-validation0-wrong-na.txt": (
        34, 8, 8589934592, 224.31, 226.16, None, 58.6481,
    ),
    "reduce_scatter_perf-8x-a100-sxm4-40gb-old-format.txt": (
        34, 8, 8589934592, 231.52, 231.25, None, 60.168,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_complete_runs(fixtures_dir: Path, name: str) -> None:
    rows, devices, size, oop_busbw, ip_busbw, wrong, avg = GOLDEN[name]
    run = nccl.parse_text(_read(fixtures_dir, name))
    assert run.complete
    assert len(run.rows) == rows
    assert len(run.devices) == devices
    largest = run.largest_row
    assert largest.size_bytes == size
    assert largest.out_of_place is not None and largest.in_place is not None
    assert largest.out_of_place.busbw_gbps == oop_busbw
    assert largest.in_place.busbw_gbps == ip_busbw
    assert largest.busbw_gbps == oop_busbw
    assert largest.wrong == wrong
    assert run.avg_busbw_gbps == avg
    assert run.out_of_bounds == 0
    assert run.warnings == ()


def test_old_format_without_redop_or_root(fixtures_dir: Path) -> None:
    run = nccl.parse_text(_read(fixtures_dir, "all_gather_perf-8x-a100-sxm4-40gb-old-format.txt"))
    assert run.header is not None
    assert (run.header.ngpus, run.header.min_bytes, run.header.max_bytes) == (8, 1, 8589934592)
    assert (run.header.step, run.header.step_kind, run.header.validation) == (2, "factor", 0)
    assert run.header.agg_iters is None and run.header.graph is None
    assert run.devices[0] == NcclDevice(0, None, 112372, "localhost", 0, "0x00", "A100-SXM4-40GB")
    # The interleaved "NCCL INFO Launch mode Parallel" line is not a row; five size-0 rows are.
    assert [r.size_bytes for r in run.rows[:6]] == [0, 0, 0, 0, 0, 32]
    assert all(r.redop is None and r.root is None for r in run.rows)
    assert run.rows[-1].out_of_place == NcclResult(33646.0, 255.31, 223.39, None)


def test_old_format_with_redop_but_no_root(fixtures_dir: Path) -> None:
    name = "reduce_scatter_perf-8x-a100-sxm4-40gb-old-format.txt"
    row = nccl.parse_text(_read(fixtures_dir, name)).largest_row
    assert (row.dtype, row.redop, row.root, row.count) == ("float", "sum", None, 268435456)


def test_new_format_multi_node(fixtures_dir: Path) -> None:
    name = "all_reduce_perf-16x-a100-sxm4-80gb-2-node-nccl2.12.12.txt"
    run = nccl.parse_text(_read(fixtures_dir, name))
    assert run.nccl_version == "2.12.12+cuda11.6"
    assert run.hosts == ("{host1}", "{host2}")
    assert run.devices[8] == NcclDevice(8, 0, 73332, "{host2}", 0, "0x00", "NVIDIA A100-SXM4-80GB")
    assert run.header is not None
    assert (run.header.validation, run.header.agg_iters, run.header.graph) == (1, 1, 0)
    first = run.rows[0]
    assert (first.size_bytes, first.count, first.redop, first.root) == (
        33554432,
        8388608,
        "sum",
        -1,
    )
    assert first.out_of_place == NcclResult(650.2, 51.61, 96.76, 0)


def test_k8s_mpi_operator_run_keeps_hosts_and_pci_bus_ids(fixtures_dir: Path) -> None:
    name = "all_reduce_perf-2node-2x-h200-k8s-mpi-operator-1K-8G.txt"
    run = nccl.parse_text(_read(fixtures_dir, name))
    assert run.hosts == (
        "nccl-test-dranet-1gpu-1nic-worker-0",
        "nccl-test-dranet-1gpu-1nic-worker-1",
    )
    assert [d.bus_id for d in run.devices] == ["0000:cc:00", "0000:97:00"]
    assert {d.name for d in run.devices} == {"NVIDIA H200"}
    assert run.nccl_version is None  # this launcher printed no "NCCL version" line


def test_trailing_space_in_header_and_summary(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "all_gather_perf-2node-2x-h200-gke-trailing-spaces-1K-8G.txt")
    assert "# Avg bus bandwidth    : 15.0709 \n" in text  # as the tool prints it
    run = nccl.parse_text(text)
    assert run.avg_busbw_gbps == 15.0709
    assert run.nccl_version == "2.25.1+cuda12.8"
    assert {r.redop for r in run.rows} == {"none"}


def test_old_header_without_group_and_validation_off(fixtures_dir: Path) -> None:
    name = "all_reduce_perf-2node-k80-old-format-validation0.txt"
    run = nccl.parse_text(_read(fixtures_dir, name))
    assert [(d.rank, d.group, d.hostname) for d in run.devices] == [
        (0, None, "pkb-2b6a393d-2"),
        (1, None, "pkb-2b6a393d-3"),
    ]
    assert all(r.wrong is None for r in run.rows)
    assert run.header is not None and run.header.iters == 1


def test_tail_excerpt_without_header(fixtures_dir: Path) -> None:
    # Log tails as people paste them: from the last Rank line on, no nThread header.
    text = _read(fixtures_dir, "all_reduce_perf-2node-2x-h200-k8s-mpi-operator-1K-8G.txt")
    tail = text[text.index("#  Rank  1 ") :]
    run = nccl.parse_text(tail)
    assert run.header is None and run.complete
    assert run.devices == (
        NcclDevice(1, 0, 21, "nccl-test-dranet-1gpu-1nic-worker-1", 0, "0000:97:00", "NVIDIA H200"),
    )
    assert run.rows == nccl.parse_text(text).rows


def test_alltoall_without_redop_and_validation_off_reads_na_as_none(fixtures_dir: Path) -> None:
    name = "alltoall_perf-8x-a100-sxm4-40gb-old-format-validation0-wrong-na.txt"
    run = nccl.parse_text(_read(fixtures_dir, name))
    assert run.header is not None and run.header.validation == 0
    assert [r.size_bytes for r in run.rows[:6]] == [0, 0, 0, 0, 0, 32]
    assert all(r.redop is None and r.wrong is None for r in run.rows)
    row = run.rows[5]
    assert row.out_of_place == NcclResult(89.00, 0.0, 0.0, None)
    assert row.in_place == NcclResult(85.13, 0.0, 0.0, None)
    assert {d.hostname for d in run.devices} == {"localhost"}


@pytest.mark.parametrize(
    ("name", "rows", "first_size", "size", "busbw"),
    [
        ("all_reduce_perf-2x-p4de-a100-80gb-srun-label-table-only.txt", 29, 8, 2147483648, 78.33),
        ("all_reduce_perf-2x-p5-h100-srun-label-table-only.txt", 32, 8, 17179869184, 487.09),
    ],
)
def test_srun_labelled_table_excerpts(
    fixtures_dir: Path, name: str, rows: int, first_size: int, size: int, busbw: float
) -> None:
    text = _read(fixtures_dir, name)
    # The publisher trimmed the summary: strict parsing calls that truncated.
    with pytest.raises(ParseError, match="truncated"):
        nccl.parse_text(text)
    run = nccl.parse_text(text, allow_partial=True)
    assert not run.complete
    assert run.avg_busbw_gbps is None
    assert len(run.rows) == rows
    assert run.rows[0].size_bytes == first_size
    assert run.largest_row.size_bytes == size
    assert run.largest_row.busbw_gbps == busbw
    assert run.largest_row.wrong == 0


def test_mpirun_tag_output_prefix(fixtures_dir: Path) -> None:
    name = "all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt"
    text = _read(fixtures_dir, name)
    tagged = "\n".join(f"[1,0]<stdout>:{line}" for line in text.splitlines())
    assert nccl.parse_text(tagged) == nccl.parse_text(text)


def test_cuda_failure_quotes_tool_error(fixtures_dir: Path) -> None:
    name = "all_gather_perf-4worker-b200-test-cuda-failure-invalid-device-ordinal-excerpt.txt"
    with pytest.raises(ParseError) as info:
        nccl.parse_text(_read(fixtures_dir, name))
    assert info.value.fmt == "nccl"
    assert "Test CUDA failure common.cu:1030 'invalid device ordinal'" in info.value.reason


def test_mpirun_slots_failure_quotes_tool_error(fixtures_dir: Path) -> None:
    with pytest.raises(ParseError) as info:
        nccl.parse_text(_read(fixtures_dir, "all_reduce_perf-mpirun-not-enough-slots-failure.txt"))
    assert "There are not enough slots available in the system" in info.value.reason


def test_truncated_table_without_summary(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt")
    cut = text[: text.index("# Out of bounds")]
    with pytest.raises(ParseError, match="truncated"):
        nccl.parse_text(cut)
    assert len(nccl.parse_text(cut, allow_partial=True).rows) == 6


def test_row_cut_mid_line_is_an_error(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt")
    cut = text[: text.index("   1149.9")]  # inside the third row
    with pytest.raises(ParseError, match="column count"):
        nccl.parse_text(cut, allow_partial=True)


@pytest.mark.parametrize("text", ["", "   \n\n", "hello world\nnot nccl\n", "\x00\x01\x02"])
def test_empty_or_garbage(text: str) -> None:
    with pytest.raises(ParseError):
        nccl.parse_text(text)


# fixture -> (warning count, first host, cuda device, source, text in the first message)
WARN_GOLDEN = {
    "nccl-net-ib-error12-vendor-err129-azure-publisher-wrapped-excerpt.txt": (
        1, "node-2", 0, "transport/net_ib.cc:1296", "with error 12, opcode 0, len",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(WARN_GOLDEN))
def test_nccl_warn_logs(fixtures_dir: Path, name: str) -> None:
    count, host, device, source, snippet = WARN_GOLDEN[name]
    text = (fixtures_dir / "nccl-warn" / name).read_text()
    warnings = nccl.parse_warnings(text)
    assert len(warnings) == count
    assert (warnings[0].host, warnings[0].cuda_device, warnings[0].source) == (host, device, source)
    assert snippet in warnings[0].message
    assert all(w.message.startswith("NET/IB") for w in warnings)
    # A log with warnings and no table is a failed run; the reason names the first WARN.
    with pytest.raises(ParseError) as info:
        nccl.parse_text(text)
    assert snippet in info.value.reason


def test_warn_line_wrapped_by_its_publisher_keeps_its_first_line(fixtures_dir: Path) -> None:
    text = (
        fixtures_dir
        / "nccl-warn"
        / "nccl-net-ib-error12-vendor-err129-azure-publisher-wrapped-excerpt.txt"
    ).read_text()
    (warning,) = nccl.parse_warnings(text)
    assert (warning.pid, warning.tid) == (5776, 5902)
    assert warning.message == (
        "NET/IB : Got completion from peer 10.2.0.5<33092> with error 12, opcode 0, len"
    )
    # The continuation line and the INFO unwind are not warnings of their own.
    assert "0, vendor err 129 (Recv)" in text.splitlines()


def test_warnings_inside_a_successful_run(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt")
    warn = (
        fixtures_dir
        / "nccl-warn"
        / "nccl-net-ib-error12-vendor-err129-azure-publisher-wrapped-excerpt.txt"
    ).read_text()
    head, tail = text.split("# Out of bounds")
    run = nccl.parse_text(head + warn + "# Out of bounds" + tail)
    assert run.avg_busbw_gbps == 210.99
    assert [w.host for w in run.warnings] == ["node-2"]


# --- JSON (-J) ----------------------------------------------------------------------------
# Built the way NVIDIA/nccl-tests src/util.cu writes it (commit 0fdb00a3): compact, keys in
# writer order, doubles with "%lf", root as a "%6i" string, booleans as strings. The numbers
# are those of the real 2-node A100 capture above (all_reduce_perf-16x-a100-sxm4-80gb-2-node-
# nccl2.12.12.txt), so text and JSON must agree.
_A100_ROWS = [
    (33554432, 8388608, (650.2, 51.61, 96.76), (648.4, 51.75, 97.03)),
    (67108864, 16777216, (956.9, 70.13, 131.49), (983.4, 68.24, 127.96)),
    (134217728, 33554432, (1740.3, 77.12, 144.60), (1734.2, 77.40, 145.12)),
    (268435456, 67108864, (2966.1, 90.50, 169.69), (2929.2, 91.64, 171.83)),
    (536870912, 134217728, (5693.6, 94.29, 176.80), (5686.5, 94.41, 177.02)),
    (1073741824, 268435456, (11013, 97.50, 182.80), (11099, 96.74, 181.39)),
]


def _placement(key: str, values: tuple[float, float, float], nwrong: str) -> str:
    time, alg, bus = values
    return f'"{key}":{{"time":{time:f},"alg_bw":{alg:f},"bus_bw":{bus:f},"nwrong":{nwrong}}}'


def _util_cu_json(*, rows: int = 6, summary: bool = True, errors: str = "") -> str:
    devices = ",".join(
        f'{{"rank":{r},"group":0,"pid":{50781 + r},"hostname":"{{host{1 + r // 8}}}",'
        f'"device":{r % 8},"device_hex":"0x00","device_info":"NVIDIA A100-SXM4-80GB"}}'
        for r in range(16)
    )
    results = ",".join(
        f'{{"size":{size},"count":{count},"type":"float","redop":"sum","root":"    -1",'
        + _placement("out_of_place", oop, "0.000000")
        + ","
        + _placement("in_place", ip, "0.000000")
        + ',"actual_iterations":20,"experiment_name":""}'
        for size, count, oop, ip in _A100_ROWS[:rows]
    )
    doc = (
        '{"version":2,"start_time":"2025-03-01 10:00:00",'
        '"args":["/opt/nccl-tests/build/all_reduce_perf","-b","32M","-e","1G","-f","2",'
        '"-g","1","-J","/tmp/nccl.json"],"env":["PATH=\\/usr\\/bin"],"nccl_version":21212,'
        '"config":{"nthreads":1,"ngpus":1,"minimum_bytes":33554432,'
        '"maximum_bytes":1073741824,"step_factor":2,"warmup_iters":5,"iterations":20,'
        '"aggregated_iterations":1,"validation":1,"graph":0,"blocking_collectives":"false",'
        f'"per_iter_timing":"false","parallel_init":"false","devices":[{devices}]}},'
        f'"results":[{results}]'
    )
    if summary:
        doc += (
            ',"out_of_bounds":{"count":0,"okay":"true"},'
            '"average_bus_bandwidth":{"bandwidth":150.209000,"okay":"unchecked"}'
        )
    doc += f',"errors":[{errors}],"end_time":"2025-03-01 10:01:00"}}'
    return doc


def test_json_matches_the_text_of_the_same_run(fixtures_dir: Path) -> None:
    text_run = nccl.parse_text(
        _read(fixtures_dir, "all_reduce_perf-16x-a100-sxm4-80gb-2-node-nccl2.12.12.txt")
    )
    json_run = nccl.parse_json(_util_cu_json())
    assert json_run.complete
    assert json_run.rows == text_run.rows
    assert json_run.avg_busbw_gbps == text_run.avg_busbw_gbps == 150.209
    assert json_run.out_of_bounds == 0
    assert json_run.largest_row.busbw_gbps == 182.80
    assert json_run.hosts == text_run.hosts == ("{host1}", "{host2}")
    assert json_run.nccl_version == "21212"
    assert json_run.header == text_run.header


def test_json_null_wrong_and_in_place_only() -> None:
    doc = json.loads(_util_cu_json(rows=1))
    row = doc["results"][0]
    row["out_of_place"] = None  # writeBenchMarkLineNullBody
    row["in_place"] = {"cpu_time": 12.5, "alg_bw": 1.2, "bus_bw": 1.5, "nwrong": None}
    run = nccl.parse_json(json.dumps(doc))
    parsed = run.rows[0]
    assert parsed.out_of_place is None
    assert parsed.in_place is not None
    assert parsed.in_place.time_us == 12.5 and parsed.in_place.wrong is None
    assert parsed.busbw_gbps == 1.5


@pytest.mark.parametrize("bad", ['"nan"', "NaN", "Infinity", "-Infinity", "1e999"])
def test_json_non_finite_numbers_are_rejected(bad: str) -> None:
    """util.cu writes NaN as "nan"; Python's json reads NaN/Infinity literals and turns 1e999
    into inf. A NaN bus bandwidth compares false to every threshold: it must not parse."""
    doc = _util_cu_json(rows=1).replace('"bus_bw":', f'"bus_bw":{bad},"x":', 1)
    with pytest.raises(ParseError, match="finite"):
        nccl.parse_json(doc)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "NaN", "1e999"])
def test_text_non_finite_numbers_are_rejected(fixtures_dir: Path, bad: str) -> None:
    text = _read(fixtures_dir, "all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt")
    row = "   536870912     134217728     float     sum      -1   4145.6  129.50  226.63      0"
    assert row in text
    with pytest.raises(ParseError, match="not a finite number"):
        nccl.parse_text(text.replace(row, row.replace("226.63", bad.rjust(6))))


def test_json_run_that_ended_early_quotes_errors() -> None:
    # jsonOutputFinalize closes every open object, so an aborted run is valid JSON without
    # the summary keys.
    text = _util_cu_json(rows=2, summary=False, errors='"NCCL failure: unhandled system error"')
    with pytest.raises(ParseError) as info:
        nccl.parse_json(text)
    assert "unhandled system error" in info.value.reason
    assert len(nccl.parse_json(text, allow_partial=True).rows) == 2


def test_json_without_results_quotes_errors() -> None:
    text = _util_cu_json(rows=0, summary=False, errors='"system not yet initialized"')
    with pytest.raises(ParseError, match="system not yet initialized"):
        nccl.parse_json(text)


@pytest.mark.parametrize(
    "text",
    ["", "{", "[]", '{"version":2}', _util_cu_json()[:700], '{"results":[{"size":"x"}]}'],
)
def test_json_garbage_or_truncated(text: str) -> None:
    with pytest.raises(ParseError):
        nccl.parse_json(text)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("config",), [1]),
        (("config", "devices"), [None]),
        (("config", "ngpus"), "8"),
        (("results",), [1]),
        (("results", 0, "in_place"), "x"),
        (("results", 0, "out_of_place", "bus_bw"), None),
        (("errors",), 5),
    ],
)
def test_json_wrong_types_raise_parse_error(path: tuple[str | int, ...], value: object) -> None:
    doc = json.loads(_util_cu_json(rows=1))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    if path == ("errors",):
        doc["results"] = []  # ignored errors of the wrong type must not hide "no results"
    with pytest.raises(ParseError):
        nccl.parse_json(json.dumps(doc))
