"""``jupyter-vgpu doctor``: is this node ready for vGPU notebooks, and if not, what to do.

Each check is a small function of a ``NodeSetup`` (the roots it reads, the GPU backend,
an optional Kubernetes client) returning ``Finding``s: ok, warn or fail, with a remedy.
Roots are injectable so the same checks run on the host (``/``), in the DaemonSet pod
(its host-path mounts) and in tests (temporary directories and the simulated backends).
"""
