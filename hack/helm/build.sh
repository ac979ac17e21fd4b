#!/usr/bin/env bash
# Build Helm at the version go.mod pins (its `tool` directive), into a cache outside the
# source tree, and print the directory that holds the `helm` binary.
# Idempotent: the directory is named by a hash of this module's files, so a second run finds
# it at once and a changed pin builds anew (older builds in the cache are removed).
#   VGPU_HELM_CACHE   where builds go (default ${XDG_CACHE_HOME:-~/.cache}/jupyter-vgpu/helm)
# Needs Go (go.mod's version or newer) and the Go module proxy for a cold build (timings in
# README.md here).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${VGPU_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jupyter-vgpu/helm}
version=$(awk '$1 == "helm.sh/helm/v4" { print $2 }' "$here/go.mod")
digest=$(cd "$here" && cat go.mod go.sum build.sh | sha256sum | cut -c1-12)
out="$cache/$version-$digest"
if [ ! -x "$out/helm" ]; then
  command -v go >/dev/null || { echo "hack/helm/build.sh: Go is needed to build Helm $version" >&2; exit 1; }
  echo "hack/helm/build.sh: building Helm $version into $out" >&2
  mkdir -p "$cache"
  building=$(mktemp -d "$cache/.building.XXXXXX")
  trap 'rm -rf "$building"' EXIT
  # `helm version` reports the pinned release, as Helm's own Makefile stamps it
  (cd "$here" && go build -mod=readonly -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
    -o "$building/helm" helm.sh/helm/v4/cmd/helm)
  find "$cache" -mindepth 1 -maxdepth 1 ! -name "$(basename "$building")" -exec rm -rf {} +
  chmod 755 "$building"
  mv "$building" "$out"
fi
echo "$out"
