"""The simulated cluster's error, in a module of its own so that the cluster and its control plane
(which runs in the cluster's process or in a child) both raise it without importing each other."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """A component did not come up; the message says which and what it was waiting for."""
