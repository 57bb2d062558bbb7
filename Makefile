# The README's two commands: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export QOS_CACHE ?= $(HOME)/.cache/kube-qos-extender

.PHONY: lock demo test venv lint typecheck unit live e2e tools criu image bench clean

$(BIN)/qos-extender: pyproject.toml requirements.lock
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the lock as constraints, without its hashes (pip's hash mode cannot hash an editable install)
	sed -e '/--hash=/d' -e 's/ \\$$//' requirements.lock > $(VENV)/constraints.txt
	$(BIN)/pip install -q -c $(VENV)/constraints.txt -e '.[dev]'
	touch $@

venv: $(BIN)/qos-extender

# The image's dependencies, transitive ones included, pinned with their hashes (the Dockerfile installs exactly
# these; the venv takes them as constraints). Run after changing [project] dependencies in pyproject.toml.
lock:
	$(PY) -m venv $(QOS_CACHE)/pip-tools
	$(QOS_CACHE)/pip-tools/bin/pip install -q pip-tools==7.6.2
	$(QOS_CACHE)/pip-tools/bin/pip-compile -q --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
	  --no-emit-find-links --output-file=requirements.lock pyproject.toml

lint: venv
	$(BIN)/ruff check extender lab tests bench e2e setup.py
	$(BIN)/ruff format --check extender lab tests bench e2e setup.py

typecheck: venv
	$(BIN)/mypy
	$(BIN)/lint-imports

# Real control-plane binaries (k8s.io/kubernetes, kwok, etcd from Go modules; Prometheus from Debian) and the
# real cluster-autoscaler 1.35.2 (kwok and externalgrpc builds, from ../shared/vendor's release source), cached
# under $(QOS_CACHE) outside the repo: ~13 + ~8 min cold, instant afterwards.
tools:
	hack/build-tools.sh
	hack/build-ca.sh

# Container images, no registry needed: docker.io (and its own dockerd when none answers), a debootstrapped
# python base, pause, busybox, kube-scheduler and kube-qos-extender:dev, saved under $(QOS_CACHE)/images.
# The wheels come from the venv's pip (hence venv).
image: venv tools
	hack/build-image.sh

# CRIU >= 4.1 built from Debian trixie's source (bookworm's 3.17 fails on this kernel); `criu check` must pass.
criu:
	hack/build-criu.sh

# CRI-O 1.34 and pinns from their Go module / C source, Debian's conmon and skopeo (hack/build-crio.sh): the
# agent's CRI-O tests (tests/test_agent_crio.py) and the CRI-O real nodes of phase 5 (hack/real-nodes.sh).
.PHONY: crio
crio:
	hack/build-crio.sh

# Helm from its Go module (hack/build-helm.sh, pinned by hack/tools/helm/go.mod; ~2 min cold, instant after):
# tests/test_chart.py lints and renders charts/kube-qos-extender with it and compares it with config/ via kubectl.
.PHONY: helm
helm:
	hack/build-helm.sh

# The unit tests that need real binaries fail without them, never skip: helm and kubectl (the chart), containerd.
unit: helm tools

# Everything that needs no cluster (CRIU tests included: they need the real criu binary).
unit: venv criu crio
	$(BIN)/pytest -m "not live" tests

# kind and its node image, built offline from our binaries (hack/build-kind-node.sh; cached, rebuilt when an
# input changes): kind, kubeadm, crictl, coredns, kubeadm's component images, CRIU in the nodes.
.PHONY: kind-node
kind-node: tools criu image
	hack/build-kind-node.sh

# Tests against a real kube-apiserver / kube-scheduler / kwok / Prometheus. Uses $KUBECONFIG when given,
# else local clusters one after the other (hack/run-live-tests.sh): the host topology (kwok nodes), then the
# product as users install it on kind (hack/kind-up.sh: kind workers, the image, config/kind applied).
live: venv tools criu crio image kind-node helm
	hack/run-live-tests.sh

e2e: live

test: lint typecheck unit live

# The README's first command (lab/demo.py): the product on a kind cluster of its own (hack/kind-up.sh; cluster
# qos-demo, state /tmp/qos-demo-kind), a workload larger than its workers, a migration, the report and its plot
# under /tmp/qos-demo-kind.report; the cluster is removed at the end, also on failure; exit non-zero when a step
# did not show what it should. Needs what kind-up runs (kind-node: tools, criu, image), all cached for `make test`.
demo: venv kind-node
	$(BIN)/python -m lab.demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
