#!/usr/bin/env bash
# End-to-end check of the local-cluster scripts with the stub extender (hack/stub_extender.py):
#   1. hack/local-up.sh with QOS_WITH_EXTENDER=1 and kwok nodes
#   2. a default-scheduler pod and a qos-scheduler pod become Running; the stub saw filter + bind for BOTH
#      (extenders are global to all profiles); Prometheus scrapes the stub over mutual TLS
#   3. restart with QOS_EXTENDER_MANAGED_RESOURCE: only the pod requesting that resource reaches the stub
#   4. hack/local-down.sh (--keep to leave the cluster running)
# Uses its own state dir and ports by default, so it does not disturb a cluster started by hand.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KEEP=0
if [[ "${1:-}" == --keep ]]; then KEEP=1; shift; fi
export QOS_STATE="${QOS_STATE:-/tmp/qos-smoke}"
export QOS_APISERVER_PORT="${QOS_APISERVER_PORT:-36443}" QOS_ETCD_PORT="${QOS_ETCD_PORT:-33790}"
export QOS_ETCD_PEER_PORT="${QOS_ETCD_PEER_PORT:-33800}" QOS_SCHEDULER_PORT="${QOS_SCHEDULER_PORT:-30259}"
export QOS_CONTROLLER_MANAGER_PORT="${QOS_CONTROLLER_MANAGER_PORT:-30257}" QOS_KWOK_PORT="${QOS_KWOK_PORT:-30247}"
export QOS_PROMETHEUS_PORT="${QOS_PROMETHEUS_PORT:-39090}" EXTENDER_URL="${EXTENDER_URL:-https://127.0.0.1:38443}"
export EXTENDER_METRICS_URL="${EXTENDER_URL}/metrics" KUBE_API="https://127.0.0.1:${QOS_APISERVER_PORT}"
export QOS_WITH_EXTENDER=1 QOS_START_EXTENDER=0  # the stub below, not the real extender
MANAGED=qos.kube-qos-extender.io/managed
NODES=("$@")
if ((${#NODES[@]} == 0)); then NODES=(m1.medium=2 batch:m1.large=1); fi

STUB_PID=""
cleanup() {
  local rc=$?
  if [[ -n "${STUB_PID}" ]]; then kill "${STUB_PID}" 2>/dev/null || true; fi
  if [[ "${KEEP}" == 0 ]]; then "${HACK_DIR}/local-down.sh" --keep-logs || true; fi
  if ((rc != 0)); then echo "SMOKE TEST FAILED (logs: ${QOS_STATE}/logs)" >&2; fi
}
trap cleanup EXIT

up() {
  local t=${SECONDS} line out
  out="$("${HACK_DIR}/local-up.sh" "${NODES[@]}")"
  while IFS= read -r line; do export "${line?}"; done <<< "${out}"
  log "local-up.sh took $((SECONDS - t))s"
}

pod() { # <name> <schedulerName> [managed]
  local extra=""
  if [[ -n "${3:-}" ]]; then extra=", ${MANAGED}: 1"; fi
  "${KUBECTL[@]}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  schedulerName: $2
  terminationGracePeriodSeconds: 0
  containers:
  - name: c
    image: registry.invalid/smoke:1
    resources: {requests: {cpu: 100m, memory: 64Mi${extra}}, limits: {memory: 64Mi${extra}}}
EOF
}

wait_running() {
  local p
  for p in "$@"; do
    "${KUBECTL[@]}" wait --for=jsonpath='{.status.phase}'=Running --timeout=30s "pod/${p}" >/dev/null \
      || { "${KUBECTL[@]}" describe pod "${p}" >&2; die "pod ${p} not Running"; }
  done
}

stub_calls() { # <verb>
  curl -sS --cacert "${EXTENDER_CA}" --cert "${EXTENDER_CLIENT_CERT}" --key "${EXTENDER_CLIENT_KEY}" \
    "${EXTENDER_URL}/metrics" | awk -v v="verb=\"$1\"" 'index($0, v) {print $2; f=1} END {if (!f) print 0}'
}

expect() { # <what> <actual> <op> <expected>
  if ! test "$2" "$3" "$4"; then die "$1: got $2, want $3 $4"; fi
  log "ok: $1 = $2"
}

T0=${SECONDS}
up
KUBECTL=("${QOS_BIN_DIR}/kubectl" --kubeconfig "${KUBECONFIG}")

python3 "${HACK_DIR}/stub_extender.py" >> "${QOS_STATE}/logs/stub-extender.log" 2>&1 &
STUB_PID=$!
for _ in $(seq 1 50); do
  curl -sf --cacert "${EXTENDER_CA}" --cert "${EXTENDER_CLIENT_CERT}" --key "${EXTENDER_CLIENT_KEY}" \
    "${EXTENDER_URL}/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done

# -- 2. both profiles go through the (global) extender
t=${SECONDS}
pod smoke-default default-scheduler
pod smoke-qos qos-scheduler
wait_running smoke-default smoke-qos
log "2 pods Running in $((SECONDS - t))s"
expect "extender bind calls (default-scheduler + qos-scheduler pods)" "$(stub_calls bind)" -ge 2
expect "extender filter calls" "$(stub_calls filter)" -ge 2
for p in smoke-default smoke-qos; do
  log "${p}: node $("${KUBECTL[@]}" get pod "${p}" -o jsonpath='{.spec.nodeName}')"
done

ok=0
for _ in $(seq 1 60); do
  health="$(curl -sS "${PROMETHEUS_URL}/api/v1/targets" | python3 -c '
import json, sys
t = [x for x in json.load(sys.stdin)["data"]["activeTargets"] if x["labels"]["job"] == "kube-qos-extender"]
print(t[0]["health"] if t else "absent")')"
  if [[ "${health}" == up ]]; then ok=1; break; fi
  sleep 0.5
done
((ok)) || die "Prometheus target kube-qos-extender is ${health}"
log "ok: Prometheus scrapes the extender over mutual TLS"

# -- 3. managedResources restricts the extender to pods requesting the resource
before_bind="$(stub_calls bind)"
export QOS_EXTENDER_MANAGED_RESOURCE="${MANAGED}"
up
pod smoke-default-2 default-scheduler
pod smoke-qos-2 qos-scheduler managed
wait_running smoke-default-2 smoke-qos-2
expect "extender bind calls after managedResources (only the pod requesting ${MANAGED})" \
  "$(($(stub_calls bind) - before_bind))" -eq 1
"${KUBECTL[@]}" delete pod smoke-default smoke-qos smoke-default-2 smoke-qos-2 --wait=true >/dev/null
log "SMOKE TEST PASSED in $((SECONDS - T0))s"
