#!/usr/bin/env bash
# Build the three images locally with docker or podman, tagged as deploy/ names them:
#   ghcr.io/jupyter-vgpu/jupyter-vgpu-node  (plugin/Dockerfile)
#   ghcr.io/jupyter-vgpu/k8s-hub            (deploy/z2jh/hub.Dockerfile)
#   ghcr.io/jupyter-vgpu/singleuser         (deploy/z2jh/singleuser.Dockerfile)
# at the package version, for this machine's platform. Multi-arch images with provenance are
# built and pushed by .github/workflows/images.yml on tags.
#   ENGINE=podman       use this engine (default: the first of docker, podman that answers)
#   REGISTRY=reg/path   another name prefix (default ghcr.io/jupyter-vgpu)
#   IMAGES="node hub"   a subset of: node hub singleuser
set -euo pipefail
cd "$(dirname "$0")/.."

registry="${REGISTRY:-ghcr.io/jupyter-vgpu}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)"
[ -n "$version" ] || { echo "images: cannot read the version from pyproject.toml" >&2; exit 1; }

engine=""
for candidate in ${ENGINE:-docker podman}; do
  command -v "$candidate" > /dev/null || continue
  # a client without a running daemon (docker) is not an engine we can build with
  if "$candidate" info > /dev/null 2>&1; then engine="$candidate"; break; fi
  echo "images: $candidate is installed but not usable ($candidate info failed: is its daemon running?)" >&2
done
if [ -z "$engine" ]; then
  echo "images: no container engine here (looked for: ${ENGINE:-docker podman}); nothing was built." >&2
  echo "images: install Docker (with BuildKit) or Podman, or let .github/workflows/images.yml build them." >&2
  exit 1
fi

declare -A dockerfile=([node]=plugin/Dockerfile [hub]=deploy/z2jh/hub.Dockerfile [singleuser]=deploy/z2jh/singleuser.Dockerfile)
declare -A name=([node]=jupyter-vgpu-node [hub]=k8s-hub [singleuser]=singleuser)
for image in ${IMAGES:-node hub singleuser}; do
  [ -n "${dockerfile[$image]:-}" ] || { echo "images: unknown image '$image' (node, hub, singleuser)" >&2; exit 2; }
  tag="$registry/${name[$image]}:$version"
  echo "== $engine build -f ${dockerfile[$image]} -t $tag ."
  # BuildKit reads <Dockerfile>.dockerignore and sets BUILDPLATFORM
  DOCKER_BUILDKIT=1 "$engine" build -f "${dockerfile[$image]}" -t "$tag" .
done
