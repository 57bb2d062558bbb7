#!/usr/bin/env bash
# Recapture tests/golden/v<KUBE_VERSION>/ from the real kube-scheduler built by hack/ (see ORIGIN.md):
# its own cluster (state /tmp/qos-golden, ports 55xxx), scheduler with the extender entry but no extender
# process (capture.py serves the real one in-process and records), once with nodeCacheCapable true and once
# false, then tears down.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../../hack/versions.env
source "${ROOT}/hack/versions.env"
export QOS_STATE=/tmp/qos-golden QOS_APISERVER_PORT=55443 QOS_ETCD_PORT=55790 QOS_ETCD_PEER_PORT=55800 \
  QOS_SCHEDULER_PORT=55259 QOS_CONTROLLER_MANAGER_PORT=55257 QOS_KWOK_PORT=55247 QOS_PROMETHEUS_PORT=55090 \
  EXTENDER_URL=https://127.0.0.1:55843 QOS_WITH_EXTENDER=1 QOS_START_EXTENDER=0 \
  QOS_EXTENDER_MANAGED_RESOURCE=qos.kube-qos-extender.io/managed
unset KUBECONFIG
OUT="${ROOT}/tests/golden/${KUBE_VERSION}"
trap '"${ROOT}/hack/local-down.sh" >/dev/null 2>&1 || true' EXIT
for mode in true false; do
  out="$(QOS_EXTENDER_NODE_CACHE=${mode} "${ROOT}/hack/local-up.sh")"
  while IFS= read -r line; do [[ "${line}" == *=* ]] && export "${line?}"; done <<< "${out}"
  "${ROOT}/.venv/bin/python" -m tests.golden.capture "${OUT}/nodecache-${mode}"
done
