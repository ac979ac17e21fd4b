# syntax=docker/dockerfile:1
# A notebook image with jupyter-vgpu: the server extension, the JupyterLab panel,
# the widgets and %vgpu. Build from the repository root (`make images`;
# .github/workflows/images.yml publishes it for amd64 and arm64):
#   docker build -f deploy/z2jh/singleuser.Dockerfile -t ghcr.io/jupyter-vgpu/singleuser:0.1.0 .
# Add your frameworks (PyTorch, JAX, ...) on top; deploy/examples/smoke-test.yaml uses
# an image with PyTorch.
ARG BASE_IMAGE=quay.io/jupyter/base-notebook:python-3.12
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

FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=wheel --chown=1000:100 /wheels /tmp/wheels
# the docker-stacks images keep their environment writable by the notebook user
RUN pip install --no-cache-dir /tmp/wheels/jupyter_vgpu-*.whl \
 && rm -rf /tmp/wheels \
 && jupyter server extension list 2>&1 | grep -q jupyter_vgpu \
 && jupyter labextension list 2>&1 | grep -q jupyter-vgpu
