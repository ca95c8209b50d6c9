"""The lab's Kubernetes API server: a SIMULATED stand-in for kube-apiserver (no real one can be
installed on the lab machine), speaking the real REST API over HTTPS for what gpuready uses.

What it serves, and how it is held to the real thing:

- TLS with the lab's CA (``pki``); client certificates (kubelets), static bearer tokens (the
  admin) and kubeadm bootstrap tokens (``bootstrap``) authenticate; a small authorizer stands in
  for RBAC, the Node authorizer and the NodeRestriction admission plugin (``server``).
- Discovery (``/version``, ``/api``, ``/api/v1``, ``/apis``), Nodes (create, get, list, update,
  patch, delete, and the ``status`` subresource), ConfigMaps and Secrets (kubeadm's
  ``kube-public/cluster-info`` and bootstrap tokens), CertificateSigningRequests (kubelet TLS
  bootstrap, auto-approved and signed as kube-controller-manager would).
- ``labelSelector`` and ``fieldSelector`` (``selectors``), JSON patch, merge patch and strategic
  merge patch with Node's list semantics (``patch``), validation with the real messages
  (``validation``), ``resourceVersion`` with 409 on a stale write, real ``Status`` bodies
  (``errors``), objects kept on disk so a restart loses nothing, and an audit log in
  kube-apiserver's JSON-lines format (``store``).

``/version`` says ``+gpuready-lab-simulated`` in its gitVersion, so every client that prints
the server version shows that it is talking to the stand-in.

It is tested from the outside only: the official Python client and a real kubectl run against
it, and its answers are compared with real API objects (tests/fixtures/k8s-api/).
"""
