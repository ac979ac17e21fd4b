"""The notebook server side of jupyter-vgpu: the REST API over the configured fact source
and requester (``jupyter_vgpu.sources``, ``jupyter_vgpu.requesters``).

Importing this package is cheap; the ExtensionApp lives in ``jupyter_vgpu.server.app``.
"""
