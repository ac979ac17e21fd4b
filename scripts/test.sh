#!/usr/bin/env bash
# Set up and run every check: lint, type-check of the pure core, frontend unit tests, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/core -x).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test || exit 1
status=0
step() { echo "== $*"; "$@" || status=1; }

step .venv/bin/ruff check jupyter_vgpu plugin tests benchmarks
step .venv/bin/mypy
if [ -f labextension/package.json ]; then
  (cd labextension && { [ node_modules/.package-lock.json -nt package.json ] && [ node_modules/.package-lock.json -nt package-lock.json ] || npm install --no-audit --no-fund; } && npm test --silent) || { echo "frontend unit tests failed"; status=1; }
fi
# the real-Kubernetes tier (tests/realkube) runs Kubernetes built from its Go modules
echo "== hack/kube/build.sh"
if VGPU_KUBE_BIN_DIR=$(hack/kube/build.sh); then export VGPU_KUBE_BIN_DIR; else status=1; fi
# the Helm chart's tests (tests/deploy/test_helm_chart.py, tests/realkube/test_real_helm.py) run
# Helm built from its Go module, as Kubernetes is
echo "== hack/helm/build.sh"
if helm_dir=$(hack/helm/build.sh); then export VGPU_HELM_BIN="$helm_dir/helm"; else status=1; fi
echo "== pytest"
mkdir -p tests/artifacts
.venv/bin/python -m pytest -p no:cacheprovider -ra --durations=30 "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests for this selection"; rc=0
fi
[ $rc -eq 0 ] || status=1
exit $status
