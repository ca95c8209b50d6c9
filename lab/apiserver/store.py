"""The stand-in's storage: objects with etcd-like revisions, kept on disk, and the audit log.

Every write bumps one cluster-wide revision and stamps it into the object's
``metadata.resourceVersion`` (as etcd's mod revision is); a list answers with the current
revision. Each object is one JSON file (``objects/<resource>/<namespace or _>/<name>.json``,
written aside and renamed), and the revision its own file, so a restarted stand-in serves the
same objects at the same resourceVersions. Stored objects are never mutated in place: a write
replaces the dict, so a reader holding one sees a consistent object.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

Key = tuple[str, str, str]  # (resource key, namespace or "", name)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root / "objects"
        self.lock = threading.RLock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._revision = 0
        self._load()

    # -- persistence ---------------------------------------------------------------------
    def _path(self, key: Key) -> Path:
        resource, namespace, name = key
        return self.root / resource / (namespace or "_") / f"{name}.json"

    def _load(self) -> None:
        rev_file = self.root / "revision"
        if rev_file.exists():
            self._revision = int(rev_file.read_text().strip() or 0)
        if not self.root.exists():
            return
        for path in self.root.glob("*/*/*.json"):
            obj = json.loads(path.read_text())
            namespace = "" if path.parent.name == "_" else path.parent.name
            self._objects[(path.parent.parent.name, namespace, path.stem)] = obj
            rv = int(obj.get("metadata", {}).get("resourceVersion", "0") or 0)
            self._revision = max(self._revision, rv)

    def _persist(self, key: Key, obj: dict[str, Any] | None) -> None:
        path = self._path(key)
        if obj is None:
            path.unlink(missing_ok=True)
        else:
            _write_atomic(path, json.dumps(obj, separators=(",", ":")).encode())
        _write_atomic(self.root / "revision", f"{self._revision}\n".encode())

    # -- reads ---------------------------------------------------------------------------
    @property
    def revision(self) -> int:
        return self._revision

    def get(self, key: Key) -> dict[str, Any] | None:
        with self.lock:
            return self._objects.get(key)

    def items(self, resource: str, namespace: str | None = None
              ) -> Iterator[tuple[Key, dict[str, Any]]]:
        with self.lock:
            found = [(k, v) for k, v in self._objects.items() if k[0] == resource
                     and (namespace is None or k[1] == namespace)]
        return iter(sorted(found, key=lambda kv: (kv[0][1], kv[0][2])))

    # -- writes (callers hold self.lock for read-modify-write) ---------------------------
    def create(self, key: Key, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self._revision += 1
            meta = dict(obj.get("metadata") or {})
            meta["uid"] = meta.get("uid") or str(uuid.uuid4())
            meta["resourceVersion"] = str(self._revision)
            meta["creationTimestamp"] = meta.get("creationTimestamp") or now_rfc3339()
            stored = {**obj, "metadata": meta}
            self._objects[key] = stored
            self._persist(key, stored)
            return stored

    def replace(self, key: Key, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self._revision += 1
            stored = {**obj, "metadata": {**obj["metadata"],
                                          "resourceVersion": str(self._revision)}}
            self._objects[key] = stored
            self._persist(key, stored)
            return stored

    def delete(self, key: Key) -> dict[str, Any] | None:
        with self.lock:
            obj = self._objects.pop(key, None)
            if obj is not None:
                self._revision += 1
                self._persist(key, None)
            return obj


class AuditLog:
    """kube-apiserver's audit backend in log mode: one audit.k8s.io/v1 Event per line, at
    level Metadata (who did what to which object, never request or response bodies)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self.lock, self.path.open("a") as handle:
            handle.write(line)


def read_audit(path: Path) -> list[dict[str, Any]]:
    """The audit events of a log file (for tests and benchmarks)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
