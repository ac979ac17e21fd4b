#!/usr/bin/env bash
# Re-resolve the locked environments from pyproject.toml's ranges: requirements/test.txt
# (the tests, lint and CI) and requirements/demo.txt (make demo), each with every wheel's
# hash and the build backend, for CPython 3.11 and newer on any platform. Run it when a
# dependency range changes or to take newer releases on purpose; scripts/setup.sh installs
# from these files only, so nothing released later changes a fresh install.
#   scripts/lock.sh            re-resolve, keeping locked versions that still satisfy the ranges
#   scripts/lock.sh --upgrade  take the newest releases the ranges allow
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.10  # the resolver; its version changes only the files' layout, not what they pin
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools"
"$tools/bin/pip" install -q --disable-pip-version-check "uv==$UV_VERSION"
for env in test demo; do
  extra=$env; [ "$env" = demo ] && extra=sim
  "$tools/bin/uv" pip compile --quiet --universal --python-version 3.11 --generate-hashes \
    --no-header --annotation-style line "$@" \
    --extra "$extra" pyproject.toml requirements/build.in -o "requirements/$env.txt"
  sed -i "1i # Locked by scripts/lock.sh (uv $UV_VERSION) from pyproject.toml [$extra] and requirements/build.in; do not edit." "requirements/$env.txt"
done
echo "lock: requirements/test.txt and requirements/demo.txt written"
