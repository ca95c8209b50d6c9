"""The scale harness: many SIMULATED SSH endpoints from one process, for the control node's side.

Booting 1,000 systemd hosts is not possible on one small machine, and not needed to measure what
the validators themselves cost at that size. ``python -m lab.scale serve --endpoints N`` serves N
SSH endpoints (asyncssh, one event loop) on the lab's loopback /24 (``GPUREADY_LAB_NET``), a few
addresses with a port per endpoint, each with its own host key (collected into a known_hosts
file, so host key checking stays on). Each endpoint answers the validators' gpu.* commands
(``nvidia-smi -q -x``, ``topo -m``, ``nvlink -s``, the kernel log through ``journalctl``) with
the lab simulators' output (lab/sim) for its hardware profile and lab faults, after its own
latency, or fails in one of the harness's ways (:data:`lab.scale.plan.FAILURES`).

It writes an inventory in the lab's format (``hosts.yml`` + the lab's group_vars) whose
environment label says SCALE HARNESS (simulated). Nothing here is a GPU node: no systemd, no
packages, no roles; only what the validators read over SSH.
"""
