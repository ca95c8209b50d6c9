"""``dcgmi diag`` output: DCGM's JSON (``-j``) and its text table -> one record per test result.

parse_json(text) -> DiagReport    ``dcgmi diag -r N -j``
parse_text(text) -> DiagReport    ``dcgmi diag -r N`` (the boxed table)
parse(text) -> DiagReport         whichever of the two ``text`` is

Each test result is a :class:`DiagEntry`: the test's name and category, the GPU it is about
(``None`` when DCGM judged all GPUs at once, as the Deployment tests do), DCGM's status
(``pass``, ``fail``, ``warn``, ``skip``) and DCGM's own messages. :func:`failures` gives the
failed ones, each with a stable code (:func:`code_for`).

JSON shapes read (DCGM's nvvs/include/NvvsCommon.h documents them; Apache-2.0):

- DCGM 3.x: everything under ``"DCGM GPU Diagnostic"``; a result names its GPUs as
  ``"gpu_ids"`` (a string ``"0,1,2"`` for all-GPU tests, an integer for per-GPU ones) or
  ``"gpu_id"``; statuses in upper case (``PASS``); ``null`` entries may sit between tests (real
  capture: tests/fixtures/dcgmi/diag-j-8gpu-dcgm3.1.0-pass-nulls-leading-warning.txt).
- DCGM 4.x (NVIDIA's JSON Schema of it, which NVIDIA's tests validate real output against:
  tests/fixtures/dcgmi/schema-diag-json-dcgm4.6.0.json; dcgmi/Diag.cpp writes it): tests
  under ``"DCGM Diagnostic"``, named by their plugin (``software``, ``pcie``, ``memory``...),
  a result names ``"entity_group"`` (``GPU``; a result of another group, a CPU, is about no
  GPU), ``"entity_group_id"`` and ``"entity_id"``; each test has a ``test_summary`` with its
  overall status and every error, those about no entity included, so a failed summary with no
  failed result is one all-GPU failure; ``entity_groups`` lists the GPUs the run covered
  (their count is the report's); ``metadata`` holds ``version`` and ``Driver Version
  Detected``. No licensed real DCGM 4 capture is in the fixtures. Warnings are objects
  ``{"warning", "error_id", "error_category", "error_severity"}`` in both.

Text table (real captures in tests/fixtures/dcgmi): ``| name | result |`` rows under section
bars (``|-----  Deployment  ----``); a result is ``Pass``, ``Pass - All``, ``Fail - GPU: 0``,
``Pass - GPUs: 1, 2, 3``, ``Skip - All``; DCGM 4 writes ``GPU0: Pass`` continuation rows.
``Warning``, ``Error`` and ``Info`` rows carry a message that DCGM cut into fixed-width pieces
(mid-word: ``... for GP`` / ``U 0 ...``), one per continuation row; the pieces are joined back
as they were. Text before the table (``Successfully ran diagnostic for group.``) is ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from validate.parsers import ParseError

FMT_JSON = "dcgmi diag -j"
FMT_TEXT = "dcgmi diag"

STATUSES = ("pass", "fail", "warn", "skip")


@dataclass(frozen=True, slots=True)
class DiagEntry:
    """One result of one test: ``gpu`` None means all GPUs at once."""

    category: str
    test: str
    gpu: int | None
    status: str
    messages: tuple[str, ...] = ()
    error_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DiagReport:
    version: str
    driver: str
    gpu_count: int | None
    entries: tuple[DiagEntry, ...]
    runtime_error: str = ""


# -- stable codes ------------------------------------------------------------------------

CODE_MEMORY = "dcgm.diag.memory"
CODE_PCIE = "dcgm.diag.pcie"
CODE_NVLINK = "dcgm.diag.nvlink"
CODE_THERMAL_POWER = "dcgm.diag.thermal_power"
CODE_ROW_REMAP_PENDING = "dcgm.diag.row_remap_pending"
CODE_ROW_REMAP_FAILED = "dcgm.diag.row_remap_failed"
CODE_DEPLOYMENT = "dcgm.diag.deployment"
CODE_COMPUTE = "dcgm.diag.compute"
CODE_OTHER = "dcgm.diag.other"

# DCGM's failure reason ids (dcgmlib/dcgm_errors.h, enum dcgmError_t; Apache-2.0) -> code.
_BY_ERROR_ID: dict[int, str] = {
    **dict.fromkeys((3, 45, 46, 86, 87, 98, 104, 107, 113, 120), CODE_PCIE),
    **dict.fromkeys((4, 5, 7, 8, 52, 55, 57, 58, 62, 79, 102, 103, 105, 106, 118), CODE_MEMORY),
    **dict.fromkeys((6, 61, 83, 85), CODE_ROW_REMAP_PENDING),
    **dict.fromkeys((80, 84, 132), CODE_ROW_REMAP_FAILED),
    **dict.fromkeys((13, 14, 70, 71, 99, 100, 112, 119, 121), CODE_NVLINK),
    **dict.fromkeys((10, 12, 40, 41, 42, 43, 63, 72), CODE_THERMAL_POWER),
    **dict.fromkeys((9, 20, 22, 23, 25, 28, 29, 108), CODE_DEPLOYMENT),
    **dict.fromkeys((50, 110), CODE_COMPUTE),
}

# What DCGM's messages say, most specific first (message texts from dcgm_errors.h and the
# real captures: "row remappings are pending", "Thermal violations totaling ...").
_BY_MESSAGE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"row remap\w* (?:is |are )?pending|pending row remap", re.I),
     CODE_ROW_REMAP_PENDING),
    (re.compile(r"row remap\w* fail|uncorrectable row remap", re.I), CODE_ROW_REMAP_FAILED),
    (re.compile(r"pending page retirement|retired pages", re.I), CODE_ROW_REMAP_PENDING),
    (re.compile(r"thermal violation|temperature|power limit|target power|clocks event", re.I),
     CODE_THERMAL_POWER),
    (re.compile(r"nvlink", re.I), CODE_NVLINK),
    (re.compile(r"\bpcie?\b|replay|link (?:width|generation)", re.I), CODE_PCIE),
    (re.compile(r"memory|double.?bit|single.?bit|\bdbe\b|\bsbe\b|\becc\b", re.I), CODE_MEMORY),
)

# Test names of DCGM 3.x (text/JSON) and 4.x (lower case) -> code.
_BY_TEST: dict[str, str] = {
    "gpu memory": CODE_MEMORY, "memory": CODE_MEMORY, "memory bandwidth": CODE_MEMORY,
    "memory_bandwidth": CODE_MEMORY, "memtest": CODE_MEMORY,
    "pcie": CODE_PCIE, "nvbandwidth": CODE_PCIE,
    "targeted power": CODE_THERMAL_POWER, "targeted_power": CODE_THERMAL_POWER,
    "diagnostic": CODE_COMPUTE, "sm stress": CODE_COMPUTE, "sm_stress": CODE_COMPUTE,
    "targeted stress": CODE_COMPUTE, "targeted_stress": CODE_COMPUTE,
    "page retirement/row remap": CODE_ROW_REMAP_PENDING,
}


def code_for(entry: DiagEntry) -> str:
    """The stable code of a failed entry: DCGM's error id, else its message, else its test,
    else the category (a Deployment test is a deployment error)."""
    for error_id in entry.error_ids:
        if error_id in _BY_ERROR_ID:
            return _BY_ERROR_ID[error_id]
    text = " ".join(entry.messages)
    for pattern, code in _BY_MESSAGE:
        if pattern.search(text):
            return code
    by_test = _BY_TEST.get(entry.test.lower())
    if by_test:
        return by_test
    for pattern, code in _BY_MESSAGE:  # a test DCGM added later ("NVLink bandwidth")
        if pattern.search(entry.test):
            return code
    if entry.category.lower() in ("deployment", "software"):
        return CODE_DEPLOYMENT
    return CODE_OTHER


def failures(report: DiagReport) -> list[tuple[DiagEntry, str]]:
    """Each failed entry with its code, in DCGM's order."""
    return [(e, code_for(e)) for e in report.entries if e.status == "fail"]


def parse(text: str) -> DiagReport:
    """JSON when the output holds a JSON document, else the text table."""
    return parse_json(text) if _json_start(text) is not None else parse_text(text)


# -- JSON ---------------------------------------------------------------------------------

def _json_start(text: str) -> int | None:
    """Offset of the first line that opens a JSON object (DCGM may print a line before it)."""
    offset = 0
    for line in text.splitlines(keepends=True):
        if line.strip() == "{" or line.lstrip().startswith('{"'):
            return offset + line.index("{")
        offset += len(line)
    return None


def _status(raw: object, where: str, fmt: str) -> str:
    word = str(raw).strip().lower()
    aliases = {"passed": "pass", "failed": "fail", "warning": "warn", "skipped": "skip",
               "not run": "skip", "notrun": "skip"}
    word = aliases.get(word, word)
    if word not in STATUSES:
        raise ParseError(fmt, f"{where}: unknown status {raw!r}")
    return word


def _gpu_ids(result: dict[str, object], where: str) -> list[int | None]:
    group = result.get("entity_group")
    if isinstance(group, str) and group.upper() != "GPU":
        return [None]  # a CPU or another entity: about no GPU
    for key in ("entity_id", "gpu_id", "gpu_ids"):
        if key not in result:
            continue
        raw = result[key]
        if isinstance(raw, bool):
            break
        if isinstance(raw, int):
            return [raw]
        if isinstance(raw, str):
            parts = [p.strip() for p in raw.split(",") if p.strip()]
            if parts and all(p.isdigit() for p in parts):
                ids = [int(p) for p in parts]
                # A Deployment result names every GPU at once: it is about all of them.
                return [None] if len(ids) > 1 else [ids[0]]
        raise ParseError(FMT_JSON, f"{where}: {key} is not a GPU id: {raw!r}")
    return [None]


def _warnings(raw: object, where: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if raw is None:
        return (), ()
    if isinstance(raw, str):
        return (raw,), ()
    if not isinstance(raw, list):
        raise ParseError(FMT_JSON, f"{where}: warnings is not a list")
    messages: list[str] = []
    ids: list[int] = []
    for item in raw:
        if isinstance(item, str):
            messages.append(item)
        elif isinstance(item, dict):
            message = item.get("warning", item.get("message", ""))
            if not isinstance(message, str):
                raise ParseError(FMT_JSON, f"{where}: warning text is not a string")
            messages.append(message)
            error_id = item.get("error_id")
            if isinstance(error_id, int) and not isinstance(error_id, bool):
                ids.append(error_id)
        elif item is not None:
            raise ParseError(FMT_JSON, f"{where}: a warning is neither text nor an object")
    return tuple(messages), tuple(ids)


def parse_json(text: str) -> DiagReport:
    start = _json_start(text)
    if start is None:
        raise ParseError(FMT_JSON, "no JSON document in the output")
    try:
        doc = json.loads(text[start:], parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ParseError(FMT_JSON, f"invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise ParseError(FMT_JSON, "the document is not an object")
    body = doc.get("DCGM GPU Diagnostic", doc.get("DCGM Diagnostic"))
    if not isinstance(body, dict):
        raise ParseError(FMT_JSON, 'no "DCGM GPU Diagnostic" or "DCGM Diagnostic" object')
    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    assert isinstance(metadata, dict)
    version = str(body.get("version", metadata.get("version", "")))
    driver = str(body.get("Driver Version Detected", doc.get(
        "Driver Version Detected", metadata.get("Driver Version Detected", ""))))
    runtime_error = body.get("runtime_error", doc.get("runtime_error", ""))
    categories = body.get("test_categories")
    if categories is None and runtime_error:
        return DiagReport(version, driver, None, (), str(runtime_error))
    if not isinstance(categories, list) or not categories:
        raise ParseError(FMT_JSON, "test_categories is missing or empty")
    entries: list[DiagEntry] = []
    gpus: set[int] = set()
    for c, cat in enumerate(categories):
        if cat is None:
            continue
        if not isinstance(cat, dict) or not isinstance(cat.get("tests"), list):
            raise ParseError(FMT_JSON, f"test_categories[{c}] has no tests list")
        category = str(cat.get("category", ""))
        for t, test in enumerate(cat["tests"]):
            if test is None:  # DCGM 3.1 writes null between tests (real capture)
                continue
            _test(test, category, f"{category or c}/tests[{t}]", entries, gpus)
    counted = _entity_gpus(doc.get("entity_groups"))
    return DiagReport(version, driver, counted or len(gpus) or None,
                      tuple(_per_gpu(entries)), str(runtime_error or ""))


def _test(test: object, category: str, where: str, entries: list[DiagEntry],
          gpus: set[int]) -> None:
    """One test's entries (and the GPUs they name), appended."""
    if not isinstance(test, dict) or not isinstance(test.get("name"), str):
        raise ParseError(FMT_JSON, f"{where} has no name")
    name = test["name"]
    results = test.get("results")
    summary = test.get("test_summary")
    if not isinstance(results, list) and isinstance(summary, dict):
        results = []  # DCGM 4 writes no results when no entity has one
    if not isinstance(results, list):
        raise ParseError(FMT_JSON, f"{where} ({name}) has no results list")
    first = len(entries)
    for r, result in enumerate(results):
        if result is None:
            continue
        at = f"{where}/results[{r}]"
        if not isinstance(result, dict) or "status" not in result:
            raise ParseError(FMT_JSON, f"{at} has no status")
        messages, ids = _warnings(result.get("warnings", result.get("warning")), at)
        status = _status(result["status"], at, FMT_JSON)
        for gpu in _gpu_ids(result, at):
            if gpu is not None:
                gpus.add(gpu)
            entries.append(DiagEntry(category, name, gpu, status, messages, ids))
    if isinstance(summary, dict) and "status" in summary:
        _summary(summary, entries, first, category, name, f"{where}/test_summary")


def _summary(summary: dict[str, object], entries: list[DiagEntry], first: int, category: str,
             name: str, at: str) -> None:
    """A DCGM 4 test's overall status: a failure no result of the test shows (an error about
    no entity) is one failure of all GPUs, with the summary's messages; a test with no results
    is its summary."""
    status = _status(summary["status"], at, FMT_JSON)
    own = entries[first:]
    if status == "skip" and own:
        return  # "Not Run" beside results that ran says nothing more
    if own and (status != "fail" or any(e.status == "fail" for e in own)):
        return
    messages, ids = _warnings(summary.get("warnings"), at)
    entries.append(DiagEntry(category, name, None, status, messages, ids))


def _entity_gpus(groups: object) -> int | None:
    """How many GPUs DCGM 4's ``entity_groups`` lists (None: no such list)."""
    if not isinstance(groups, list):
        return None
    count = 0
    for group in groups:
        if isinstance(group, dict) and str(group.get("entity_group", "")).upper() == "GPU":
            entities = group.get("entities")
            count += len(entities) if isinstance(entities, list) else 0
    return count or None


def _no_constant(name: str) -> object:
    raise ParseError(FMT_JSON, f"{name} is not a number")


# -- text table ---------------------------------------------------------------------------

_SECTION = re.compile(r"^[|+]-+\s+(?P<name>[A-Za-z][A-Za-z /]*?)\s+-+[+|]")
_RESULT = re.compile(
    r"^(?P<status>Pass|Fail|Warn|Skip|Error)(?:\s*-\s*(?P<who>All|GPUs?:\s*[\d,\s]+))?\s*$",
    re.I)
_PER_GPU = re.compile(r"^GPU\s*(?P<gpu>\d+)\s*:\s*(?P<status>Pass|Fail|Warn|Skip)\s*$", re.I)
_MESSAGE_ROWS = frozenset({"warning", "error", "info"})
_METADATA = {"dcgm version": "version", "driver version detected": "driver",
             "gpu device ids detected": "ids", "gpu device ids": "ids"}
_GPU_IN_TEXT = re.compile(r"\bGPU\s*(\d+)\b")


@dataclass
class _Row:
    name: str
    pieces: list[str]
    width: int


def _rows(text: str) -> Iterable[tuple[str, _Row | None]]:
    """(section, row) for each table row; a continuation row extends the row before it.
    Yields (section, None) at each section bar, so a message row ends there."""
    section = ""
    row: _Row | None = None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            if row is not None:
                yield section, row
                row = None
            section = m.group("name").strip()
            yield section, None
            continue
        if not line.startswith("|") or line.startswith("|="):
            continue
        cells = line.split("|")
        if len(cells) < 3:
            continue
        name = cells[1].strip()
        value = cells[2]
        # One pad space before, two after the text DCGM cut; the last piece of a message
        # may come with its cell not closed (real capture).
        closed = line.rstrip().endswith("|") and len(cells) >= 4
        width = len(value) - 3 if closed else len(value)
        piece = value[1:1 + width] if width > 0 else value.strip()
        if name:
            if row is not None:
                yield section, row
            row = _Row(name, [piece], width)
        elif row is not None:
            row.pieces.append(piece)
    if row is not None:
        yield section, row


def _who(spec: str | None, gpu_count: int | None) -> list[int | None]:
    if not spec or spec.lower() == "all":
        return [None]
    return [int(g) for g in re.findall(r"\d+", spec)]


def parse_text(text: str) -> DiagReport:
    meta: dict[str, str] = {}
    entries: list[DiagEntry] = []
    # The last result rows of the test before a message row: a Warning or Info row belongs
    # to the test above it.
    last: list[int] = []
    seen_row = False
    for section, row in _rows(text):
        if row is None:
            last = []
            continue
        seen_row = True
        name = row.name
        key = name.lower()
        if key == "diagnostic" and "".join(row.pieces).strip().lower() == "result":
            continue  # the header row
        if section.lower() == "metadata" and key in _METADATA:
            meta[_METADATA[key]] = "".join(row.pieces).strip()
            continue
        if key in _MESSAGE_ROWS:
            message = "".join(row.pieces).strip()
            if key == "error" and not any(entries[i].status == "fail" for i in last):
                # A Deployment error: DCGM names no failed test, the message says what and
                # which GPU (real capture: "GPU 3 has uncorrectable memory errors and row
                # remappings are pending").
                named = _GPU_IN_TEXT.search(message)
                entries.append(DiagEntry(section, "Error", int(named.group(1)) if named else None,
                                         "fail", (message,)))
                continue
            if not last:
                continue
            _attach(entries, last, message, key)
            continue
        last = []
        for piece in row.pieces:
            value = piece.strip()
            if not value:
                continue
            m = _RESULT.match(value)
            p = _PER_GPU.match(value)
            if m:
                status = m.group("status").lower()
                status = "fail" if status == "error" else status
                for who in _who(m.group("who"), None):
                    last.append(len(entries))
                    entries.append(DiagEntry(section, name, who, status))
            elif p:
                last.append(len(entries))
                entries.append(DiagEntry(section, name, int(p.group("gpu")),
                                         p.group("status").lower()))
            else:
                raise ParseError(FMT_TEXT, f"{section or 'table'}/{name}: unknown result "
                                           f"{value!r}")
    if not seen_row:
        raise ParseError(FMT_TEXT, "no diagnostic table in the output")
    ids = [i for i in meta.get("ids", "").replace(" ", "").split(",") if i]
    return DiagReport(meta.get("version", ""), meta.get("driver", ""), len(ids) or None,
                      tuple(_per_gpu(entries)))


def _per_gpu(entries: list[DiagEntry]) -> list[DiagEntry]:
    """A ``Fail - All`` result whose messages each name a GPU (one Warning row per GPU, as
    DCGM prints them) becomes one result per GPU with its own message."""
    out: list[DiagEntry] = []
    for e in entries:
        named = [_GPU_IN_TEXT.match(m) for m in e.messages]
        if e.status != "fail" or e.gpu is not None or not e.messages or not all(named):
            out.append(e)
            continue
        by_gpu: dict[int, list[str]] = {}
        for m, message in zip(named, e.messages, strict=True):
            assert m is not None
            by_gpu.setdefault(int(m.group(1)), []).append(message)
        out.extend(DiagEntry(e.category, e.test, gpu, e.status, tuple(msgs), e.error_ids)
                   for gpu, msgs in by_gpu.items())
    return out


def _attach(entries: list[DiagEntry], last: list[int], message: str, kind: str) -> None:
    """Give ``message`` to the results of the test above it: to the result of the GPU the
    message names when there is one (a Warning for GPU 0 under ``Fail - GPU: 0``), else to
    every failed or warned result of that test, else to all of them."""
    named = _GPU_IN_TEXT.search(message)
    targets = [i for i in last if named and entries[i].gpu == int(named.group(1))]
    if not targets:
        targets = [i for i in last if entries[i].status in ("fail", "warn")] or list(last)
    for i in targets:
        e = entries[i]
        status = e.status
        if kind == "warning" and status == "pass" and e.gpu is not None:
            status = "warn"
        entries[i] = DiagEntry(e.category, e.test, e.gpu, status, (*e.messages, message),
                               e.error_ids)
