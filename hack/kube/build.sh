#!/usr/bin/env bash
# Build hack/kube's three programs at the versions go.mod pins, into a cache outside the
# source tree, and print the directory that holds them:
#   kube      etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (first argument)
#   kubelet   the kubelet
#   fake-cri  Kubernetes' fake CRI runtime
# Idempotent: the directory is named by a hash of this module's files, so a second run finds
# it at once and a changed pin builds anew (older builds in the cache are removed).
#   VGPU_KUBE_CACHE   where builds go (default ${XDG_CACHE_HOME:-~/.cache}/jupyter-vgpu/kube)
# Needs Go (go.mod's version or newer) and the Go module proxy for a cold build: about
# 7 minutes on 2 cores, seconds once Go's build cache is warm (README.md here).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${VGPU_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jupyter-vgpu/kube}
version=$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/go.mod")
digest=$(cd "$here" && cat go.mod go.sum build.sh ./*.go ./*/*.go | sha256sum | cut -c1-12)
out="$cache/$version-$digest"
if [ ! -x "$out/kube" ] || [ ! -x "$out/kubelet" ] || [ ! -x "$out/fake-cri" ]; then
  command -v go >/dev/null || { echo "hack/kube/build.sh: Go is needed to build Kubernetes $version" >&2; exit 1; }
  major=${version#v}; major=${major%%.*}
  minor=${version#v*.}; minor=${minor%%.*}
  stamp=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  echo "hack/kube/build.sh: building Kubernetes $version into $out" >&2
  mkdir -p "$cache"
  building=$(mktemp -d "$cache/.building.XXXXXX")
  trap 'rm -rf "$building"' EXIT
  for program in kube kubelet fake-cri; do
    package=.; [ "$program" = kube ] || package=./$program
    (cd "$here" && go build -mod=readonly -trimpath -ldflags "-s -w$stamp" -o "$building/$program" "$package")
  done
  find "$cache" -mindepth 1 -maxdepth 1 ! -name "$(basename "$building")" -exec rm -rf {} +
  chmod 755 "$building"
  mv "$building" "$out"
fi
echo "$out"
