"""The notebook server side of jupyter-vgpu: REST API, fact sources and share requests.

Importing this package is cheap; the ExtensionApp lives in ``jupyter_vgpu.server.app``.
"""
