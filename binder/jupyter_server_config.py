"""Binder: JupyterLab on the simulated cluster, behind Binder's own server at /vgpu-demo/.

`jupyter-vgpu demo` starts the simulated cluster (API, scheduler + extender, kubelet
stand-in, device plugin and metrics on simulated GPUs) and JupyterLab as the process of a
notebook pod holding a vGPU share, so its panel shows a real allocation. jupyter-server-proxy
starts it on first visit, on a free port, under Binder's base URL.
"""

c = get_config()  # noqa: F821 (defined by Jupyter when it loads this file)

c.ServerProxy.servers = {
    "vgpu-demo": {
        # The lab listens on 127.0.0.1 behind Binder's own authenticated server, and
        # jupyter-server-proxy cannot hand a browser the lab's random token: no token here.
        "command": ["jupyter-vgpu", "demo", "--no-browser", "--port", "{port}", "--base-url", "{base_url}vgpu-demo/",
                    "--token", ""],
        "absolute_url": True,
        "timeout": 180,
        "launcher_entry": {"title": "vGPU demo (simulated cluster)"},
    }
}
