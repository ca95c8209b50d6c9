"""Real container runtime components for the lab: containerd 2 and runc, built from source."""
