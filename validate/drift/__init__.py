"""Drift: one read-only pass that says, per node, what differs from what the inventory
declares (configuration, versions, runtime, labels and taints, performance against the node's
own history). ``python -m validate drift``; see :mod:`validate.drift.run`. (Nothing is imported
here: the command line reads validate/drift/cli.py without loading the rest.)"""
