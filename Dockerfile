# syntax=docker/dockerfile:1.7
# kube-qos-extender: one image for `qos-extender serve | agent | autoscaler | simulate`.
# Multi-stage: wheels are built with the full toolchain, the runtime stage is python slim + the venv only,
# running as an unprivileged user (65532) with no shell tools beyond the base image.
#
# Pinned by tag here; pin by digest in your registry mirror (`python:3.11.14-slim-bookworm@sha256:...`).
# NOTE: this Dockerfile has not been built in the project's CI: the build machines have no Docker engine
# (hack/README.md). hack/kind-up.sh builds it on a machine with Docker.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY extender/ extender/
COPY config/extender.yaml config/extender.yaml
# Dependencies are pinned in pyproject.toml (==); numpy/scipy come as manylinux wheels, no compiler needed.
RUN /opt/venv/bin/pip install --no-compile . \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib \
 && mkdir -p /opt/venv/share/kube-qos-extender && cp config/extender.yaml /opt/venv/share/kube-qos-extender/

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kube-qos-extender" \
      org.opencontainers.image.description="SLO- and cost-aware kube-scheduler extender" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["qos-extender"]
CMD ["serve", "--config", "/etc/qos-extender/config/extender.yaml"]
