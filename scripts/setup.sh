#!/usr/bin/env bash
# Set up everything jupyter-vgpu needs on a fresh Debian machine, idempotently.
#   scripts/setup.sh demo   -> .venv with the simulated cluster and JupyterLab
#   scripts/setup.sh test   -> the above + test tools, Debian's chromium for browser tests
# Python packages come from requirements/{demo,test}.txt (locked with hashes by scripts/lock.sh);
# VGPU_UNLOCKED=1 takes pyproject.toml's ranges at their newest instead (the scheduled job).
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
  # tests/realkube builds Kubernetes from its Go modules (hack/kube): Go from go.mod's line on
  need_go=$(awk '$1 == "go" { print $2 }' hack/kube/go.mod)
  have_go=$(command -v go >/dev/null && go env GOVERSION | sed 's/^go//' || echo 0)
  if [ "$(printf '%s\n' "$need_go" "$have_go" | sort -V | head -n 1)" != "$need_go" ]; then
    echo "setup: the real-cluster tests need Go $need_go or newer on PATH (Debian's golang-go is older)" >&2
    exit 1
  fi
fi

python=${PYTHON:-python3}
case "$what" in
  demo|test) lock="requirements/$what.txt" ;;
  *) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: $python is $("$python" -V 2>&1); the locked environments need Python 3.11 or newer (set PYTHON=...)" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
# Everything comes from the lock, with its hashes, so a release made tomorrow changes nothing
# here (scripts/lock.sh re-resolves it). The package itself is installed editable without
# build isolation, so its build backend is the locked one too. A stamp of what went into the
# last install skips both when nothing changed (the panel's sources count: the editable
# install builds the panel).
stamp=$( { cat "$lock" pyproject.toml; find labextension/src labextension/style labextension/*.json -type f 2>/dev/null \
           | LC_ALL=C sort | xargs cat; } | sha256sum | cut -c1-16)
if [ -n "${VGPU_UNLOCKED:-}" ]; then
  # The scheduled newest-releases job (.github/workflows/newest.yml): pyproject.toml's ranges
  # at their newest, then how that differs from the lock, so a failure names what moved.
  extra=$what; [ "$what" = demo ] && extra=sim
  PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m pip install -q --disable-pip-version-check \
    --upgrade --upgrade-strategy eager -e ".[$extra]"
  rm -f .venv/.jupyter-vgpu-setup
  .venv/bin/python scripts/lock_drift.py "$lock"
elif [ "$(cat .venv/.jupyter-vgpu-setup 2>/dev/null)" != "$what $stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --require-hashes --no-deps -r "$lock"
  # the build runs npm, whose scripts call jupyter-builder from this venv
  PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  .venv/bin/python -m pip check
  echo "$what $stamp" > .venv/.jupyter-vgpu-setup
fi
# The guard-rail tests also run against the real PyTorch when a CPU wheel is on this machine's
# disk (never from the index: that would be a multi-GB CUDA build); without it they say why they skip.
if [ "$what" = test ]; then
  torch_wheel=$(ls /opt/wheels/torch-*+cpu-cp3*-*.whl 2>/dev/null | grep "cp$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')-" | head -n 1 || true)
  if [ -n "$torch_wheel" ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install -q --disable-pip-version-check "$torch_wheel" || echo "setup: could not install $torch_wheel; the real-PyTorch test will skip" >&2
  fi
fi
echo "setup: .venv ready ($what, from ${VGPU_UNLOCKED:+the newest releases, not }$lock)"
