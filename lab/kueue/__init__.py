"""Kueue for the lab: its manager built from source (build.py), installed as its release
installs it (install.py)."""
