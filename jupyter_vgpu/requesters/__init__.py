"""Asking for a different share from the notebook: ``base`` (the interface and a share's
validation), ``hub`` (JupyterHub restarts the server), ``tracker`` (requests in flight) and
``registry`` (the configured requester's tracker). Used by the server extension and the kernel.
"""
