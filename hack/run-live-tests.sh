#!/usr/bin/env bash
# Run the tests marked `live` (tests/ and e2e/) against a real control plane.
# With KUBECONFIG set, that cluster is used as it is; otherwise hack/local-up.sh brings one up on 127.0.0.1
# under $QOS_STATE (default /tmp/qos-ci) and hack/local-down.sh removes it afterwards (logs kept on failure).
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
  out="$(hack/local-up.sh service:m1.medium=2 batch:m1.large=1)"
  while IFS= read -r line; do [[ "${line}" == *=* ]] && export "${line?}"; done <<< "${out}"
fi
echo "live tests against ${KUBECONFIG}" >&2
"${PYTEST}" -m live tests e2e "$@"
