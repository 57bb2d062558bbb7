#!/usr/bin/env bash
# Run the tests marked `live` (tests/ and e2e/) against a real control plane.
# With KUBECONFIG set, that cluster is used as it is (it must run the extender: e2e needs EXTENDER_URL,
# EXTENDER_CA, EXTENDER_CLIENT_CERT/KEY and PROMETHEUS_URL too); otherwise hack/local-up.sh brings the full
# topology up on 127.0.0.1 (QOS_WITH_EXTENDER=1: the real extender, the marker managedResources, Prometheus
# scraping it) under $QOS_STATE (default /tmp/qos-ci) and hack/local-down.sh removes it afterwards (logs kept
# on failure). tests/test_webhook_live.py starts its own in-process extender beside it (own scheduler name).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
PYTEST="${ROOT}/.venv/bin/pytest"

if [[ -z "${KUBECONFIG:-}" ]]; then
  export QOS_STATE="${QOS_STATE:-/tmp/qos-ci}"
  cleanup() {
    local rc=$?
    if ((rc == 0)); then hack/local-down.sh; else
      echo "live tests failed: control-plane logs kept in ${QOS_STATE}/logs" >&2
      hack/local-down.sh --keep-logs || true
    fi
  }
  trap cleanup EXIT
  t0=${SECONDS}
  # No kwok nodes: every test creates (and deletes) its own, and the autoscaler test needs an empty cluster.
  out="$(QOS_WITH_EXTENDER=1 hack/local-up.sh)"
  echo "local-up with the extender: $((SECONDS - t0)) s" >&2
  while IFS= read -r line; do [[ "${line}" == *=* ]] && export "${line?}"; done <<< "${out}"
fi
echo "live tests against ${KUBECONFIG}" >&2
t1=${SECONDS}
rc=0
"${PYTEST}" -m live tests e2e "$@" || rc=$?
echo "live tests: $((SECONDS - t1)) s (rc ${rc})" >&2
exit "${rc}"
