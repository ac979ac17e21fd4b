#!/usr/bin/env bash
# Set up everything jupyter-vgpu needs on a fresh Debian machine, idempotently.
#   scripts/setup.sh demo   -> .venv with the simulated cluster and JupyterLab
#   scripts/setup.sh test   -> the above + test tools, Debian's chromium for browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-test}

apt_install() {  # apt_install PACKAGE... (only what is missing; root or sudo)
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Node.js builds the JupyterLab panel from source (the wheel ships it prebuilt).
command -v npm >/dev/null || apt_install nodejs npm
# kubectl is used by the tests (kustomize rendering, kubectl against the simulated API).
if [ "$what" = test ]; then
  command -v kubectl >/dev/null || apt_install kubectl || echo "setup: kubectl unavailable; kubectl tests will fail" >&2
  [ -x /usr/bin/chromium ] || apt_install chromium
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
case "$what" in
  demo) extras="sim" ;;
  test) extras="test" ;;
  *) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]"
# The guard-rail tests also run against the real PyTorch when a CPU wheel is on this machine's
# disk (never from the index: that would be a multi-GB CUDA build); without it they say why they skip.
if [ "$what" = test ]; then
  torch_wheel=$(ls /opt/wheels/torch-*+cpu-cp3*-*.whl 2>/dev/null | grep "cp$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')-" | head -n 1 || true)
  if [ -n "$torch_wheel" ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install -q --disable-pip-version-check "$torch_wheel" || echo "setup: could not install $torch_wheel; the real-PyTorch test will skip" >&2
  fi
fi
echo "setup: .venv ready ($extras)"
