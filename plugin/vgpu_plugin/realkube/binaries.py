"""Where the Kubernetes programs come from: a directory holding ``kube`` (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, kubectl), ``kubelet`` and
``fake-cri``, as ``hack/kube/build.sh`` builds them from Kubernetes' Go modules."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ENV_BIN_DIR = "VGPU_KUBE_BIN_DIR"
PROGRAMS = ("kube", "kubelet", "fake-cri")


class BinariesError(RuntimeError):
    """The Kubernetes programs are neither given nor buildable here."""


def build_script() -> Path | None:
    """hack/kube/build.sh of the checkout this package runs from, if it does run from one."""
    script = Path(__file__).resolve().parents[3] / "hack" / "kube" / "build.sh"
    return script if script.exists() else None


def kube_bin_dir(given: str | os.PathLike[str] | None = None) -> Path:
    """``given``, else ``$VGPU_KUBE_BIN_DIR``, else what ``hack/kube/build.sh`` prints (it builds on
    first use, seconds when cached). Raises BinariesError saying how to get them."""
    chosen = given or os.environ.get(ENV_BIN_DIR)
    if chosen:
        directory = Path(chosen)
    else:
        script = build_script()
        if script is None:
            raise BinariesError(f"no Kubernetes programs: set ${ENV_BIN_DIR} to a directory with "
                                f"{', '.join(PROGRAMS)} (hack/kube/build.sh in a jupyter-vgpu checkout builds them)")
        result = subprocess.run(["bash", str(script)], capture_output=True, text=True)
        if result.returncode != 0:
            raise BinariesError(f"hack/kube/build.sh failed:\n{result.stderr[-4000:]}")
        directory = Path(result.stdout.strip().splitlines()[-1])
    missing = [name for name in PROGRAMS if not os.access(directory / name, os.X_OK)]
    if missing:
        raise BinariesError(f"{directory} lacks {', '.join(missing)} (hack/kube/build.sh builds them)")
    return directory
