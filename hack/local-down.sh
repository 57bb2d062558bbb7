#!/usr/bin/env bash
# Stop everything hack/local-up.sh started (from the pid files in $QOS_STATE, default /tmp/qos-local)
# and remove the state dir.
#   --keep-logs   keep $QOS_STATE/logs (everything else is removed)
#   --keep-state  stop the processes but keep the whole state dir (certs, etcd data, logs)
set -euo pipefail

QOS_STATE="${QOS_STATE:-/tmp/qos-local}"
KEEP=none
for arg in "$@"; do
  case "${arg}" in
    --keep-logs) KEEP=logs ;;
    --keep-state) KEEP=all ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "unknown argument: ${arg}" >&2; exit 1 ;;
  esac
done

if [[ ! -d "${QOS_STATE}" ]]; then
  echo "nothing to do: ${QOS_STATE} does not exist" >&2
  exit 0
fi
PIDS="${QOS_STATE}/pids"

# Reverse start order: clients first, etcd last.
stopped=()
for name in qos-extender kwok kube-scheduler kube-controller-manager kube-apiserver prometheus etcd; do
  f="${PIDS}/${name}.pid"
  [[ -s "${f}" ]] || continue
  pid="$(cat "${f}")"
  # Only kill the pid if it still runs the binary we started (pids get reused).
  want="$(cat "${PIDS}/${name}.exe" 2>/dev/null || true)"
  have="$(readlink -f "/proc/${pid}/exe" 2>/dev/null || true)"
  if [[ -z "${have}" || "${have}" != "${want}" ]]; then
    rm -f "${f}"
    continue
  fi
  kill "${pid}" 2>/dev/null || true
  stopped+=("${name}:${pid}")
done
for entry in "${stopped[@]}"; do
  pid="${entry#*:}"
  for _ in $(seq 1 100); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${pid}" 2>/dev/null; then
    echo "${entry%%:*} (pid ${pid}) did not stop in 10s: SIGKILL" >&2
    kill -9 "${pid}" 2>/dev/null || true
  fi
  rm -f "${PIDS}/${entry%%:*}.pid"
done
echo "stopped: ${stopped[*]:-nothing running}" >&2

# Real nodes last (kubelets, containerd, their containers, namespaces, cgroups, mounts, the relay, the lab's
# routes): once Prometheus and the apiserver are gone, nothing on the host dials a pod IP any more, so lifting
# the lab's unreachable routes cannot send anything off the machine. Also after a failed `up` (relay only).
if [[ -e "${QOS_STATE}/real-nodes" || -s "${PIDS}/apigw-relay.pid" ]]; then
  if ! QOS_STATE="${QOS_STATE}" "$(dirname "${BASH_SOURCE[0]}")/real-nodes.sh" down; then
    echo "real nodes: teardown FAILED; state kept in ${QOS_STATE} (run hack/real-nodes.sh down again)" >&2
    exit 1
  fi
fi

case "${KEEP}" in
  all) echo "kept ${QOS_STATE}" >&2 ;;
  logs)
    find "${QOS_STATE}" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
    echo "kept logs in ${QOS_STATE}/logs" >&2 ;;
  none) rm -rf "${QOS_STATE}"; echo "removed ${QOS_STATE}" >&2 ;;
esac
