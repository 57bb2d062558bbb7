# kube-qos-extender: one image for `qos-extender serve | agent | autoscaler | simulate`.
# Multi-stage: the build stage makes the venv (dependencies from PyPI as manylinux wheels, no compiler needed;
# the gRPC stubs generated when the package is built); the runtime stage is the same base
# + that venv only, running as the unprivileged user 65532.
#
# Built and tested without any registry by hack/build-image.sh (classic builder, DOCKER_BUILDKIT=0, with
# --build-arg PYTHON_IMAGE=qos-local/python:3.11-bookworm, a debootstrapped Debian bookworm + python3) and
# e2e/test_image.py. Any Debian-like base with python3 >= 3.11 and its venv module works; the default is pinned
# by tag here, pin it by digest in your registry mirror (`python:3.11.14-slim-bookworm@sha256:...`).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
LABEL io.kube-qos-extender.stage=build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Dependencies first, in their own layer: every one, transitive ones included, at the version and with the hashes
# of requirements.lock (generated from pyproject.toml by pip-compile --generate-hashes; tests/test_lock.py keeps
# them in step), so two builds install the same bytes; a code change does not install numpy, scipy and grpcio
# again. An optional wheelhouse/ in the build context (hack/build-image.sh fills it
# with the wheels of the dependencies and build requirements, fetched by the host's pip with the host's CA
# trust and cache) makes the build use no index at all; without it pip downloads from PyPI as usual.
COPY requirements.lock wheelhous[e] /wheelhouse/
RUN if ls /wheelhouse/*.whl > /dev/null 2>&1; then \
      printf '[global]\nno-index = true\nfind-links = /wheelhouse\n' > /etc/pip.conf; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --require-hashes --no-deps -r /wheelhouse/requirements.lock
COPY pyproject.toml setup.py README.md ./
COPY extender/ extender/
# Building the package generates the gRPC stubs (setup.py; grpcio-tools and mypy-protobuf are build requirements
# only, from the wheelhouse like the rest). pip itself is not needed at run time.
RUN /opt/venv/bin/pip install --no-deps . \
 && /opt/venv/bin/pip uninstall -q -y pip \
 && /opt/venv/bin/qos-extender --help > /dev/null

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="kube-qos-extender" \
      org.opencontainers.image.description="SLO- and cost-aware kube-scheduler extender" \
      org.opencontainers.image.licenses="Apache-2.0"
# skopeo (Debian bookworm's, pinned): an agent on a CRI-O node writes each checkpoint image into CRI-O's
# containers/storage with it, since CRI has no image import (extender/agent/crio.py). Nothing else uses it.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends skopeo=1.9.3+ds1-1+b10 \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /usr/share/doc/* /usr/share/man/*
RUN echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'nonroot:x:65532:' >> /etc/group \
 && mkdir -p /home/nonroot && chown 65532:65532 /home/nonroot
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/home/nonroot
COPY --from=build /opt/venv /opt/venv
USER 65532:65532
WORKDIR /home/nonroot
EXPOSE 8443
ENTRYPOINT ["qos-extender"]
CMD ["serve", "--config", "/etc/qos-extender/config/extender.yaml"]
