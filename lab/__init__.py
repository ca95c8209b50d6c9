"""The gpuready lab: a simulated GPU fleet of real Debian hosts under systemd-nspawn.

Simulated, and said so wherever it shows: the GPU hardware, the tools that talk to it and the
vendor packages. Real: the hosts, systemd, sshd, apt/dpkg, containerd and fio.
"""
