"""The extension loads from IPython configuration alone (c.InteractiveShellApp.extensions)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_loaded_by_config_in_a_fresh_ipython(tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "ipython_config.py").write_text(
        'c.InteractiveShellApp.extensions = ["jupyter_vgpu"]\nc.VGPUSettings.source = "none"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU_", "JUPYTERHUB_", "JUPYTER_VGPU_"))}
    result = subprocess.run(
        [sys.executable, "-m", "IPython", f"--profile-dir={profile}", "--no-banner", "-c", "%vgpu status"],
        capture_output=True, text=True, timeout=120, env={**env, "IPYTHONDIR": str(tmp_path / "ipython")})
    assert "No vGPU is allocated" in result.stdout, result.stdout + result.stderr
    assert "torch      not needed" in result.stdout
