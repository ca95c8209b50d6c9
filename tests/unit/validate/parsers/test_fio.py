"""fio JSON parser against every real JSON capture in fixtures/fio."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validate.parsers import ParseError, fio

KIB = 1024


def _read(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / "fio" / name).read_text()


def test_fio_2_1_4_kib_units_and_microsecond_latency(fixtures_dir: Path) -> None:
    run = fio.parse_json(
        _read(fixtures_dir, "fio-2.1.4-json-4jobs-seqwrite-seqread-randwrite-randread.json")
    )
    assert run.version == "fio-2.1.4"
    # The file name says 4 jobs; the report holds 5 (a parallel random read was added).
    assert [(j.name, j.groupid, j.error) for j in run.jobs] == [
        ("sequential_write", 0, 0),
        ("sequential_read", 1, 0),
        ("random_write_test", 2, 0),
        ("random_read_test", 3, 0),
        ("random_read_test_parallel", 4, 0),
    ]
    write = run.job("sequential_write").write
    assert write.bw_bytes_per_s == 68118 * KIB
    assert write.io_bytes == 361984 * KIB  # fio 2.x io_bytes is KiB
    assert (write.iops, write.runtime_ms, write.total_ios) == (133, 5314, None)
    assert write.clat is not None
    assert write.clat.mean_ns == pytest.approx(477734.84 * 1000)
    assert write.clat.percentile(99.0) == 823296 * 1000
    # 19 real percentiles; the duplicated "0.00": 0 padding is dropped.
    assert len(write.clat.percentiles_ns) == 19
    assert write.clat.percentiles_ns[0] == (1.0, 387072 * 1000)
    assert run.job("sequential_write").read.io_bytes == 0
    rand = run.job("random_read_test").read
    assert (rand.bw_bytes_per_s, rand.iops) == (1269 * KIB, 317)
    assert run.disk_util[0] == fio.FioDiskUtil("sdb", 19464, 10508, 97.54)
    assert run.global_options == ()
    assert run.failed_jobs == ()


def test_fio_2_17_job_options_and_duplicate_global_key(fixtures_dir: Path) -> None:
    run = fio.parse_json(_read(fixtures_dir, "fio-2.17-json-hist-gce-pd.json"))
    assert run.version == "fio-2.17"
    assert len(run.jobs) == 2
    read_job, write_job = run.jobs
    assert read_job.name == "rand_16k_read_100%-io-depth-1-num-jobs-2"
    assert (read_job.option("rw"), read_job.option("numjobs")) == ("randread", "2")
    assert read_job.read.iops == 8086.673998
    assert read_job.read.bw_bytes_per_s == 129386 * KIB
    assert read_job.read.total_ios == 80891
    assert read_job.read.clat is not None and read_job.read.clat.percentile(99.0) == 1352000
    assert write_job.write.iops == 2457.017193
    assert write_job.write.bw_bytes_per_s == 39312 * KIB
    assert dict(run.global_options)["filename"] == "/dev/disk/by-id/google-pkb-7fb0c9d8-0-data-0-0"
    assert dict(run.global_options)["group_reporting"] == "1"
    assert run.disk_util == ()


def test_fio_3_14_git_build_nanosecond_latency(fixtures_dir: Path) -> None:
    run = fio.parse_json(_read(fixtures_dir, "fio-3.14-json-randwrite-intel-d3-s4610-sata300.json"))
    assert run.version == "fio-3.14-6-g97134"
    (job,) = run.jobs
    assert (job.name, job.option("rw"), job.option("filename")) == (
        "random-read",
        "randwrite",
        "/dev/sdh",
    )
    write = job.write
    assert write.bw_bytes_per_s == 70593656  # bw_bytes, exact
    assert write.iops == 17234.77942
    assert write.io_bytes == 4235689984
    assert (write.runtime_ms, write.total_ios) == (60001, 1034104)
    assert write.clat is not None and write.lat is not None and write.slat is not None
    assert write.clat.percentile(99.0) == 58112
    assert write.clat.percentile(99.99) == 411648
    assert write.clat.mean_ns == 43511.938155
    assert write.lat.percentiles_ns == ()
    assert job.read.io_bytes == 0 and job.read.iops == 0.0
    assert run.disk_util[0].name == "sdh"


def test_fio_3_16_group_reporting_lat_percentiles(fixtures_dir: Path) -> None:
    run = fio.parse_json(
        _read(fixtures_dir, "fio-3.16-json-randrw-4k-nvme-numjobs4-group-reporting.json")
    )
    (job,) = run.jobs  # numjobs=4 reported as one group
    assert job.name == "rand_read_write"
    assert dict(run.global_options)["numjobs"] == "4"
    assert (job.read.bw_bytes_per_s, job.read.iops) == (348743777, 85138.890741)
    assert (job.write.bw_bytes_per_s, job.write.iops) == (348450387, 85066.128925)
    assert job.read.io_bytes == 10463010816
    # lat_percentiles=1 moves the percentiles from clat to lat.
    assert job.read.clat is not None and job.read.clat.percentiles_ns == ()
    assert job.read.lat is not None and job.read.lat.percentile(99.0) == 2244608
    assert job.write.lat is not None and job.write.lat.percentile(99.9) == 2605056
    assert job.trim is not None and job.trim.io_bytes == 0
    assert run.disk_util[0].util_pct == 99.840351


def test_fio_3_33_three_stonewalled_jobs(fixtures_dir: Path) -> None:
    run = fio.parse_json(
        _read(
            fixtures_dir, "fio-3.33-json-seqwrite-seqread-randread4k-3jobs-stonewall-vm-disk.json"
        )
    )
    assert run.version == "fio-3.33"
    assert [(j.name, j.groupid) for j in run.jobs] == [
        ("seqwrite", 0),
        ("seqread", 1),
        ("randread4k", 2),
    ]
    seqwrite, seqread, randread = run.jobs
    assert (seqwrite.write.bw_bytes_per_s, seqwrite.write.iops) == (2656136811, 2533.089458)
    assert seqwrite.write.io_bytes == 7987003392
    assert (seqread.read.bw_bytes_per_s, seqread.read.iops) == (723835609, 690.30343)
    assert (randread.read.bw_bytes_per_s, randread.read.iops) == (85708902, 20925.024992)
    assert randread.read.clat is not None
    assert randread.read.clat.percentile(99.0) == 8028160
    assert randread.read.clat.percentile(42.0) is None
    assert randread.option("bs") == "4k"
    assert run.failed_jobs == ()


def test_leading_warning_lines_are_noise(fixtures_dir: Path) -> None:
    name = "fio-3.33-json-seqwrite-seqread-randread4k-3jobs-stonewall-vm-disk.json"
    text = _read(fixtures_dir, name)
    warning = (
        "fio: this platform does not support process shared mutexes, forcing use of threads. "
        "Use the 'thread' option to get rid of this warning."
    )
    noisy = f"{warning}\nnote: both iodepth >= 1 and synchronous I/O engine are selected\n{text}"
    noisy += "\nfio: some trailing message\n"
    run = fio.parse_json(noisy)
    assert run.noise == (warning, "note: both iodepth >= 1 and synchronous I/O engine are selected")
    assert run.jobs == fio.parse_json(text).jobs


def test_job_error_is_reported(fixtures_dir: Path) -> None:
    doc = json.loads(_read(fixtures_dir, "fio-3.14-json-randwrite-intel-d3-s4610-sata300.json"))
    doc["jobs"][0]["error"] = 5  # EIO, as fio reports a failed device
    run = fio.parse_json(json.dumps(doc))
    assert [j.name for j in run.failed_jobs] == ["random-read"]
    assert run.jobs[0].error == 5


def test_truncated_json(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "fio-3.16-json-randrw-4k-nvme-numjobs4-group-reporting.json")
    with pytest.raises(ParseError, match="truncated"):
        fio.parse_json(text[: len(text) // 2])


def test_job_missing_its_write_section(fixtures_dir: Path) -> None:
    doc = json.loads(
        _read(
            fixtures_dir, "fio-3.33-json-seqwrite-seqread-randread4k-3jobs-stonewall-vm-disk.json"
        )
    )
    del doc["jobs"][1]["write"]
    with pytest.raises(ParseError, match="unexpected structure"):
        fio.parse_json(json.dumps(doc))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  \n",
        "Segmentation fault\n",
        "fio: failed parsing rw=foo\n",
        "{}",
        '{"fio version": "fio-3.33", "jobs": []}',
        "[1, 2, 3]",
    ],
)
def test_empty_or_garbage(text: str) -> None:
    with pytest.raises(ParseError) as info:
        fio.parse_json(text)
    assert info.value.fmt == "fio-json"


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_rejected(fixtures_dir: Path, bad: str) -> None:
    """The real fio 3.33 capture with one bandwidth replaced: NaN must not pass a threshold,
    and Infinity (which crashed the report) must be a parse error."""
    text = _read(
        fixtures_dir, "fio-3.33-json-seqwrite-seqread-randread4k-3jobs-stonewall-vm-disk.json"
    )
    assert '"bw_bytes" : 2656136811,' in text
    with pytest.raises(ParseError, match="finite"):
        fio.parse_json(text.replace('"bw_bytes" : 2656136811,', f'"bw_bytes" : {bad},', 1))
