"""The lab package repository: flat apt repositories, signed with a lab key, served on loopback.

The layout mirrors the vendors' URL paths (``compute/cuda/repos/debian12/x86_64/``,
``libnvidia-container/stable/deb/amd64/``, ``core:/stable:/v1.37/deb/``; flat repositories, as
the real ones are), so the roles run the same apt path with only the host swapped, as for a
site mirror. Each repository directory holds ``Packages``, ``Release``, ``InRelease``; the lab's
one signing key is published, ASCII-armored, under each vendor's key file name (``3bf863cc.pub``,
``8793F200.pub``, ``gpgkey``, ``Release.key``) and as ``keyring.gpg``/``keyring.asc`` at the
root. It is made once per lab directory: its fingerprint goes into the generated inventory,
where the roles pin it as a site pins its mirror's key.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from email.utils import formatdate
from pathlib import Path

from lab.errors import LabError
from lab.packages import Package, Repository, all_packages, repositories
from lab.paths import LabPaths

DEFAULT_PORT = int(os.environ.get("GPUREADY_LAB_REPO_PORT", "18080"))
KEY_UID = "gpuready lab repository (SIMULATED packages) <lab@gpuready.invalid>"


def _gpg(paths: LabPaths, *args: str, stdin: bytes | None = None) -> bytes:
    paths.gnupg.mkdir(mode=0o700, parents=True, exist_ok=True)
    proc = subprocess.run(["gpg", "--homedir", str(paths.gnupg), "--batch", "--yes",
                           "--pinentry-mode", "loopback", "--passphrase", "", *args],
                          input=stdin, capture_output=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"gpg {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def ensure_key(paths: LabPaths) -> bytes:
    """The lab signing key (made once); returns the binary public keyring."""
    if not _gpg(paths, "--list-secret-keys", "--with-colons").strip():
        _gpg(paths, "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
    return _gpg(paths, "--export", KEY_UID)


def key_fingerprint(paths: LabPaths) -> str:
    """The lab signing key's full fingerprint (what the generated inventory pins)."""
    listing = _gpg(paths, "--with-colons", "--list-keys", KEY_UID).decode()
    for line in listing.splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    raise LabError(f"no fingerprint for the lab key in {paths.gnupg}")


def recipe_hash() -> str:
    """The hash of every package the repositories serve (names, versions, files, scripts)."""
    blob = json.dumps([asdict(p) for p in all_packages()], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _build_deb(pkg: Package, out_dir: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuready-deb-") as tmp:
        root = Path(tmp)
        debian = root / "DEBIAN"
        debian.mkdir(mode=0o755)
        (debian / "control").write_text(pkg.control())
        for script, body in (("postinst", pkg.postinst), ("prerm", pkg.prerm)):
            if body:
                (debian / script).write_text(body)
                (debian / script).chmod(0o755)
        if pkg.conffiles:
            (debian / "conffiles").write_text("".join(f"{c}\n" for c in pkg.conffiles))
        for f in pkg.files:
            target = root / f.path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if f.link:
                target.symlink_to(f.link)
                continue
            if f.source:
                shutil.copyfile(f.source, target)
            else:
                target.write_text(f.content)
            target.chmod(f.mode)
        deb = out_dir / f"{pkg.name}_{pkg.version.replace(':', '%3a')}_{pkg.arch}.deb"
        proc = subprocess.run(["dpkg-deb", "--root-owner-group", f"-Z{pkg.compression}", "--build",
                               str(root), str(deb)], capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            raise LabError(f"building {pkg.name} {pkg.version}: {proc.stderr.strip()}")


def _release(paths: LabPaths, repo_dir: Path, label: str,
             files: tuple[str, ...] = ("Packages", "Packages.gz"),
             fields: tuple[str, ...] = ()) -> None:
    """Release, InRelease and Release.gpg in ``repo_dir``, over ``files`` (relative to it)."""
    lines = [
        "Origin: gpuready-lab",
        f"Label: gpuready lab simulator ({label})",
        *fields,
        f"Date: {formatdate(usegmt=True)}",
        "Architectures: amd64 all",
        "Description: SIMULATED vendor packages for the gpuready lab",
    ]
    for field, algo in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        lines.append(f"{field}:")
        for name in files:
            data = (repo_dir / name).read_bytes()
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data)} {name}")
    release = repo_dir / "Release"
    release.write_text("\n".join(lines) + "\n")
    (repo_dir / "InRelease").write_bytes(
        _gpg(paths, "--local-user", KEY_UID, "--clearsign", "--output", "-", str(release)))
    (repo_dir / "Release.gpg").write_bytes(
        _gpg(paths, "--local-user", KEY_UID, "--armor", "--detach-sign", "--output", "-",
             str(release)))


def ensure_repo(paths: LabPaths) -> Path:
    """Build the repositories if their recipe changed; return the directory to serve."""
    try:
        return _ensure_repo(paths)
    finally:
        # gpg starts an agent for the signing key: end it, the lab leaves nothing running.
        if paths.gnupg.exists():
            subprocess.run(["gpgconf", "--homedir", str(paths.gnupg), "--kill", "all"],
                           capture_output=True, check=False)


def _ensure_repo(paths: LabPaths) -> Path:
    stamp = paths.repo_dir / ".recipe"
    keyring = ensure_key(paths)
    # A new lab key (its gnupg directory removed) must re-sign every repository.
    recipe = f"{recipe_hash()} {key_fingerprint(paths)}"
    if stamp.exists() and stamp.read_text() == recipe:
        return paths.repo_dir
    if paths.repo_dir.exists():
        shutil.rmtree(paths.repo_dir)
    paths.repo_dir.mkdir(parents=True)
    armored = _gpg(paths, "--armor", "--export", KEY_UID)
    (paths.repo_dir / "keyring.gpg").write_bytes(keyring)
    (paths.repo_dir / "keyring.asc").write_bytes(armored)
    for repo in repositories():
        if repo.suite:
            _dists_repository(paths, repo)
        else:
            repo_dir = paths.repo_dir / repo.path
            repo_dir.mkdir(parents=True)
            for pkg in all_packages():
                if pkg.repo == repo.id:
                    _build_deb(pkg, repo_dir)
            scan = _scan(repo_dir, ".", repo.path)
            (repo_dir / "Packages").write_bytes(scan)
            (repo_dir / "Packages.gz").write_bytes(gzip.compress(scan, mtime=0))
            _release(paths, repo_dir, repo.label)
        # The vendor's key file name, holding the lab's key (the roles pin its fingerprint).
        (paths.repo_dir / repo.key_path).write_bytes(armored)
    stamp.write_text(recipe)
    return paths.repo_dir


def _scan(root: Path, directory: str, what: str) -> bytes:
    scan = subprocess.run(["dpkg-scanpackages", "--multiversion", directory, "/dev/null"],
                          cwd=root, capture_output=True, check=False)
    if scan.returncode != 0:
        raise LabError(f"dpkg-scanpackages {what}: {scan.stderr.decode().strip()}")
    return scan.stdout


def _dists_repository(paths: LabPaths, repo: Repository) -> None:
    """A repository laid out as Docker's (not flat): ``dists/<suite>/<component>/binary-amd64/
    Packages`` and its ``Release``, the packages in ``dists/<suite>/pool/<component>/amd64/``
    (their ``Filename`` relative to the repository's root, as apt fetches them)."""
    root = paths.repo_dir / repo.path
    suite = Path("dists") / repo.suite
    pool = suite / "pool" / repo.component / "amd64"
    (root / pool).mkdir(parents=True, exist_ok=True)
    for pkg in all_packages():
        if pkg.repo == repo.id:
            _build_deb(pkg, root / pool)
    scan = _scan(root, str(pool), f"{repo.path} {repo.suite}")
    index = Path(repo.component) / "binary-amd64"
    (root / suite / index).mkdir(parents=True)
    (root / suite / index / "Packages").write_bytes(scan)
    (root / suite / index / "Packages.gz").write_bytes(gzip.compress(scan, mtime=0))
    _release(paths, root / suite, repo.label,
             files=(str(index / "Packages"), str(index / "Packages.gz")),
             fields=(f"Suite: {repo.suite}", f"Codename: {repo.suite}",
                     f"Components: {repo.component}"))


def repo_url(port: int, repo: str = "") -> str:
    return f"http://127.0.0.1:{port}/{repo}"


def start_server(paths: LabPaths, port: int) -> int:
    """Serve the repositories on 127.0.0.1:port; return the server's pid."""
    with socket.socket() as probe:
        # SO_REUSEADDR as http.server itself sets it: a just-stopped lab's TIME_WAIT sockets
        # must not look like another server on the port.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise LabError(f"lab repository port 127.0.0.1:{port} is in use ({exc.strerror}); "
                           f"choose another with --repo-port") from None
    log = (paths.run / "repo-http.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(paths.repo_dir)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc.pid
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise LabError(f"lab repository server did not start on 127.0.0.1:{port} "
                   f"(see {paths.run / 'repo-http.log'})")


def stop_server(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
