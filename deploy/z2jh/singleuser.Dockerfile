# syntax=docker/dockerfile:1
# A notebook image with jupyter-vgpu: the server extension, the JupyterLab panel,
# the widgets and %vgpu. Build from the repository root:
#   docker build -f deploy/z2jh/singleuser.Dockerfile -t ghcr.io/jupyter-vgpu/singleuser:0.1.0 .
ARG BASE_IMAGE=quay.io/jupyter/base-notebook:python-3.12

FROM python:3.12-slim-bookworm AS wheel
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE_IMAGE}
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir /tmp/wheels/jupyter_vgpu-*.whl \
 && jupyter server extension list 2>&1 | grep -q jupyter_vgpu \
 && jupyter labextension list 2>&1 | grep -q jupyter-vgpu
