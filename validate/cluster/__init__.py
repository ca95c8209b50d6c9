"""The cluster layer above the nodes, from the same inventory: the GPU Operator in host-driver
mode with each pool's device plugin sharing, Kueue's flavors and queues, team namespaces with
their quotas, and the acceptance Job per pool (docs/cluster.md).

``spec`` reads and checks what the inventory declares, ``render`` turns it into manifests
(pure), ``apply`` applies them with server-side apply and prunes what it owns.
"""
