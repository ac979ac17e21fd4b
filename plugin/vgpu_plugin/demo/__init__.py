"""The vGPU demo: a GPU cluster on ``simkube`` with every real component, and JupyterLab on it.

``cluster`` wires the simulated API and scheduler (``simkube``) to the extender, the kubelet
stand-in (``kubelet``) and the node daemons on simulated GPUs; ``lab`` runs JupyterLab as a
notebook pod's process (entrypoint ``notebook``); ``neighbours`` are pods with simulated GPU
work; ``main`` is ``jupyter-vgpu sim`` and ``jupyter-vgpu demo``.
"""
