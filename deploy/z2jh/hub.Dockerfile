# syntax=docker/dockerfile:1
# The Zero to JupyterHub hub image plus jupyter-vgpu[hub] (for hub.extraConfig).
# Build from the repository root, matching the chart's hub image tag (`make images`;
# .github/workflows/images.yml publishes it for amd64 and arm64):
#   docker build -f deploy/z2jh/hub.Dockerfile -t ghcr.io/jupyter-vgpu/k8s-hub:0.1.0 .
ARG HUB_IMAGE=quay.io/jupyterhub/k8s-hub:4.2.0
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG NODE_IMAGE=node:20-bookworm-slim

# Multi-arch builds: every stage but the last runs on the builder's platform (its node
# binary must run in the wheel stage); only the last, the image itself, is per platform.
FROM --platform=$BUILDPLATFORM ${NODE_IMAGE} AS node

# pure-Python wheel with the prebuilt lab extension: built once, on the builder's platform
FROM --platform=$BUILDPLATFORM ${PYTHON_IMAGE} AS wheel
COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules/npm /usr/local/lib/node_modules/npm
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${HUB_IMAGE}
COPY --from=wheel /wheels /tmp/wheels
# the chart's hub image installs its Python packages as root and runs as jovyan (uid 1000)
USER 0
RUN pip install --no-cache-dir "$(ls /tmp/wheels/jupyter_vgpu-*.whl)[hub]" \
 && rm -rf /tmp/wheels \
 && python -c "import jupyter_vgpu.hub"
USER 1000
