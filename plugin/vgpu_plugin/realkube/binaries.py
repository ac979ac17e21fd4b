"""Where the Kubernetes programs come from: a directory holding ``kube`` (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, kubectl), ``kubelet`` and
``fake-cri``, as ``hack/kube/build.sh`` builds them from Kubernetes' Go modules; and Helm,
as ``hack/helm/build.sh`` builds it from Helm's Go module."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ENV_BIN_DIR = "VGPU_KUBE_BIN_DIR"
PROGRAMS = ("kube", "kubelet", "fake-cri")
ENV_HELM_BIN = "VGPU_HELM_BIN"


class BinariesError(RuntimeError):
    """The Kubernetes programs are neither given nor buildable here."""


def build_script(module: str = "kube") -> Path | None:
    """hack/<module>/build.sh of the checkout this package runs from, if it does run from one."""
    script = Path(__file__).resolve().parents[3] / "hack" / module / "build.sh"
    return script if script.exists() else None


def _built_dir(module: str) -> Path:
    """The directory hack/<module>/build.sh prints (it builds on first use, seconds when cached)."""
    script = build_script(module)
    if script is None:
        raise BinariesError(f"no hack/{module}/build.sh: this is not a jupyter-vgpu checkout")
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    if result.returncode != 0:
        raise BinariesError(f"hack/{module}/build.sh failed:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def kube_bin_dir(given: str | os.PathLike[str] | None = None) -> Path:
    """``given``, else ``$VGPU_KUBE_BIN_DIR``, else what ``hack/kube/build.sh`` prints (it builds on
    first use, seconds when cached). Raises BinariesError saying how to get them."""
    chosen = given or os.environ.get(ENV_BIN_DIR)
    if chosen:
        directory = Path(chosen)
    else:
        if build_script() is None:
            raise BinariesError(f"no Kubernetes programs: set ${ENV_BIN_DIR} to a directory with "
                                f"{', '.join(PROGRAMS)} (hack/kube/build.sh in a jupyter-vgpu checkout builds them)")
        directory = _built_dir("kube")
    missing = [name for name in PROGRAMS if not os.access(directory / name, os.X_OK)]
    if missing:
        raise BinariesError(f"{directory} lacks {', '.join(missing)} (hack/kube/build.sh builds them)")
    return directory


def helm_bin(given: str | os.PathLike[str] | None = None) -> Path:
    """The ``helm`` program: ``given``, else ``$VGPU_HELM_BIN``, else the one ``hack/helm/build.sh``
    builds (Helm at the release hack/helm/go.mod pins). Raises BinariesError saying how to get it."""
    chosen = given or os.environ.get(ENV_HELM_BIN)
    if chosen:
        program = Path(chosen)
    else:
        if build_script("helm") is None:
            raise BinariesError(f"no helm: set ${ENV_HELM_BIN} to a helm program (hack/helm/build.sh in a "
                                "jupyter-vgpu checkout builds it)")
        program = _built_dir("helm") / "helm"
    if not os.access(program, os.X_OK):
        raise BinariesError(f"{program} is not an executable helm (hack/helm/build.sh builds one)")
    return program
