"""Real Kubernetes for the lab, built from source through the Go module proxy.

``go.mod``/``go.sum`` here are a wrapper module that pins the release (``require
k8s.io/kubernetes``); ``build.py`` builds its binaries once per machine into a cache outside the
checkout.
"""
