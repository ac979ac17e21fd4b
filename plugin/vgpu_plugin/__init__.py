"""Node and scheduler side of jupyter-vgpu: device plugin, scheduler extender, metrics, the demo cluster."""
