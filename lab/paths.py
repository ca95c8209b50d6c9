"""Where the lab keeps its state. Everything the lab writes lives under one directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class LabPaths:
    """The lab's directories. ``root`` defaults to ``<repo>/.lab`` (git-ignored)."""

    root: Path

    @classmethod
    def default(cls) -> LabPaths:
        return cls(Path(os.environ.get("GPUREADY_LAB_DIR", REPO_ROOT / ".lab")).resolve())

    @property
    def cache(self) -> Path:
        """Rootfs cache: survives `lab down` and the checkout, rebuilt only when its recipe changes.

        Outside the checkout (``$XDG_CACHE_HOME/gpuready/lab``, else ``~/.cache/gpuready/lab``),
        so a fresh clone on the same machine, a second ``make test`` or ``make demo``, finds
        it; each rootfs is named by its recipe's hash. ``GPUREADY_LAB_CACHE`` overrides it.
        """
        if "GPUREADY_LAB_CACHE" in os.environ:
            return Path(os.environ["GPUREADY_LAB_CACHE"]).resolve()
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return (Path(base) / "gpuready" / "lab").resolve()

    @property
    def run(self) -> Path:
        """State of the running lab (overlays, hardware descriptions, pids)."""
        return self.root / "run"

    @property
    def state_file(self) -> Path:
        return self.run / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.root / "lab.lock"

    @property
    def ssh_dir(self) -> Path:
        return self.root / "ssh"

    @property
    def ssh_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def repo_dir(self) -> Path:
        """The simulated vendor package repositories, served over HTTP on loopback."""
        return self.root / "repo"

    @property
    def gnupg(self) -> Path:
        return self.root / "gnupg"

    def host_dir(self, name: str) -> Path:
        return self.run / "hosts" / name

    @property
    def sim_dir(self) -> Path:
        """The simulators, bind-mounted read-only into every host."""
        return REPO_ROOT / "lab" / "sim"

    @property
    def inventory_dir(self) -> Path:
        return Path(os.environ.get("GPUREADY_LAB_INVENTORY", REPO_ROOT / "inventory" / "lab"))
