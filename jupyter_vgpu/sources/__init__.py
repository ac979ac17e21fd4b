"""Where the notebook's GPU facts come from: one interface (``base``), several adapters.

Adapters: ``node_api`` (this project's node metrics server), ``gpu_manager`` (a TKEStack
gpu-manager node), ``local_nvml`` (a workstation, no Kubernetes) and ``base.NoVGPUSource``;
``registry`` names them and picks one. Used by the server extension and the kernel alike.
"""
