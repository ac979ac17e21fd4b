"""jupyter-vgpu: fractional GPUs for Jupyter notebooks on Kubernetes."""

__version__ = "0.1.0"
