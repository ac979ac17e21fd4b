# syntax=docker/dockerfile:1
# The Zero to JupyterHub hub image plus jupyter-vgpu[hub] (for hub.extraConfig).
# Build from the repository root, matching the chart's hub image tag:
#   docker build -f deploy/z2jh/hub.Dockerfile -t ghcr.io/jupyter-vgpu/k8s-hub:0.1.0 .
ARG HUB_IMAGE=quay.io/jupyterhub/k8s-hub:4.2.0

FROM python:3.12-slim-bookworm AS wheel
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${HUB_IMAGE}
COPY --from=wheel /wheels /tmp/wheels
RUN wheel="$(ls /tmp/wheels/jupyter_vgpu-*.whl)" \
 && pip install --no-cache-dir "${wheel}[hub]" \
 && python -c "import jupyter_vgpu.hub"
