#!/usr/bin/env bash
# The local topology on kind, for users with Docker: the cluster's own kube-scheduler keeps default-scheduler;
# config/kind (= config/base + one replica, the locally built image, a plain Prometheus) adds the qos-scheduler
# Deployment (kube-scheduler + extender sidecar, leader election on); kwok runs in the cluster and fakes the
# flavoured nodes from config/flavours.yaml, like hack/local-up.sh.
#
# NOT run by CI: the CI machines have no Docker engine (see README "kind"). hack/local-up.sh is the tested path.
#
# Usage: hack/kind-up.sh [[GROUP:]FLAVOUR=COUNT ...]      e.g. hack/kind-up.sh service:m1.medium=2 batch:m1.large=1
#        hack/kind-up.sh --down                           delete the cluster, stop the port-forwards
# Needs: docker, kind (>= 0.27), kubectl >= 1.27 (kustomize built in), openssl, python3 with PyYAML, network
# access to registry.k8s.io, quay.io (Prometheus) and github.com (kwok release manifests).
# stdout: the same KEY=VALUE lines as hack/local-up.sh (e2e/conftest.py reads them), EXTENDER_URL and
# PROMETHEUS_URL through `kubectl port-forward` on 127.0.0.1.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER="${QOS_KIND_CLUSTER:-kube-qos}"
STATE="${QOS_KIND_STATE:-/tmp/qos-kind}"
EXTENDER_LOCAL_PORT="${QOS_KIND_EXTENDER_PORT:-18443}"
PROMETHEUS_LOCAL_PORT="${QOS_KIND_PROMETHEUS_PORT:-19090}"
KWOK_URL="https://github.com/kubernetes-sigs/kwok/releases/download/${KWOK_VERSION}"
NS=kube-qos-system

for b in docker kind openssl python3; do command -v "${b}" >/dev/null || die "${b} is required"; done
if [[ -x "${BIN_DIR}/kubectl" ]]; then KUBECTL_BIN="${BIN_DIR}/kubectl"; else KUBECTL_BIN="$(command -v kubectl)" || die "kubectl is required"; fi
KCFG="${STATE}/kubeconfig"
K=("${KUBECTL_BIN}" --kubeconfig "${KCFG}")

stop_forwards() {
  for f in "${STATE}"/port-forward-*.pid; do
    [[ -s "${f}" ]] || continue
    pid="$(cat "${f}")"
    if grep -q port-forward "/proc/${pid}/cmdline" 2>/dev/null; then kill "${pid}" 2>/dev/null || true; fi
    rm -f "${f}"
  done
}

if [[ "${1:-}" == --down ]]; then
  stop_forwards
  kind delete cluster --name "${CLUSTER}"
  rm -rf "${STATE}"
  exit 0
fi
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0; fi

mkdir -p "${STATE}/certs"
chmod 700 "${STATE}"
if ! kind get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
  log "kind: creating cluster ${CLUSTER}"
  kind create cluster --name "${CLUSTER}" --config "${REPO_ROOT}/config/kind/cluster.yaml" --wait 120s >&2
fi
kind get kubeconfig --name "${CLUSTER}" > "${KCFG}"

log "image: docker build -t kube-qos-extender:dev"
docker build -t kube-qos-extender:dev "${REPO_ROOT}" >&2
kind load docker-image kube-qos-extender:dev --name "${CLUSTER}" >&2

# ---------------------------------------------------------------- certificates and Secrets
C="${STATE}/certs"
if [[ ! -s "${C}/ca.crt" ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "${C}/ca.key" -subj "/CN=kube-qos-kind-ca" -days 3650 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out "${C}/ca.crt" 2>/dev/null
fi
cert() { # <name> <CN> <eku> [san]
  [[ -s "${C}/$1.crt" ]] && return 0
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n%s' \
    "$3" "${4:+subjectAltName=$4}" > "${C}/$1.ext"
  openssl req -newkey rsa:2048 -nodes -keyout "${C}/$1.key" -subj "/CN=$2" -out "${C}/$1.csr" 2>/dev/null
  openssl x509 -req -in "${C}/$1.csr" -CA "${C}/ca.crt" -CAkey "${C}/ca.key" -CAcreateserial -days 365 -sha256 \
    -extfile "${C}/$1.ext" -out "${C}/$1.crt" 2>/dev/null
  rm -f "${C}/$1.csr" "${C}/$1.ext"
}
cert serving kube-qos-extender serverAuth \
  "IP:127.0.0.1,DNS:localhost,DNS:qos-extender,DNS:qos-extender.${NS}.svc,DNS:qos-extender.${NS}.svc.cluster.local"
cert scheduler-client kube-scheduler-extender-client clientAuth
cert metrics-client prometheus-extender-client clientAuth
chmod 600 "${C}"/*.key

"${K[@]}" apply -f "${REPO_ROOT}/config/base/namespace.yaml" >&2
"${K[@]}" -n "${NS}" create secret generic qos-extender-tls --dry-run=client -o yaml \
  --from-file=ca.crt="${C}/ca.crt" --from-file=tls.crt="${C}/serving.crt" --from-file=tls.key="${C}/serving.key" \
  --from-file=client.crt="${C}/scheduler-client.crt" --from-file=client.key="${C}/scheduler-client.key" \
  | "${K[@]}" apply -f - >&2
"${K[@]}" -n "${NS}" create secret generic qos-extender-metrics-client --dry-run=client -o yaml \
  --from-file=ca.crt="${C}/ca.crt" --from-file=tls.crt="${C}/metrics-client.crt" --from-file=tls.key="${C}/metrics-client.key" \
  | "${K[@]}" apply -f - >&2

# ---------------------------------------------------------------- kwok, the qos-scheduler, nodes
"${K[@]}" apply -f "${KWOK_URL}/kwok.yaml" >&2
"${K[@]}" apply -f "${KWOK_URL}/stage-fast.yaml" >&2
"${K[@]}" apply --server-side --force-conflicts -k "${REPO_ROOT}/config/kind" >&2
"${K[@]}" -n kube-system rollout status deployment/kwok-controller --timeout=180s >&2
"${K[@]}" -n "${NS}" rollout status deployment/qos-scheduler --timeout=300s >&2
"${K[@]}" -n "${NS}" rollout status deployment/qos-prometheus --timeout=180s >&2

if (($#)); then
  python3 - "${REPO_ROOT}/config/flavours.yaml" "$@" <<'PY' | "${K[@]}" apply -f - >&2
import json, re, sys, yaml
flavours = {f["name"]: f for f in yaml.safe_load(open(sys.argv[1]))["flavours"]}
items = []
for arg in sys.argv[2:]:
    m = re.fullmatch(r"(?:(service|batch):)?([A-Za-z0-9._-]+)=([0-9]+)", arg)
    if not m or m.group(2) not in flavours:
        sys.exit(f"bad node argument {arg!r} (want [service|batch:]flavour=count; flavours: {', '.join(flavours)})")
    group, name, count = m.group(1) or "service", m.group(2), int(m.group(3))
    f = flavours[name]
    res = {"cpu": str(f["cpu"]), "memory": str(f["memory"]), "pods": str(f.get("pods", 110))}
    for i in range(count):
        node = f"{group}-{name.replace('.', '-')}-{i}"
        items.append({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": node,
            "annotations": {"kwok.x-k8s.io/node": "fake", "qos.kube-qos-extender.io/price-per-hour": str(f["price_per_hour"])},
            "labels": {"type": "kwok", "kubernetes.io/hostname": node, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": name,
                       "qos.kube-qos-extender.io/node-group": group}},
            "spec": {},
            "status": {"allocatable": res, "capacity": res}})
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
fi

# ---------------------------------------------------------------- port-forwards and result
stop_forwards
setsid "${KUBECTL_BIN}" --kubeconfig "${KCFG}" -n "${NS}" port-forward --address 127.0.0.1 svc/qos-extender \
  "${EXTENDER_LOCAL_PORT}:8443" > "${STATE}/port-forward-extender.log" 2>&1 < /dev/null &
echo $! > "${STATE}/port-forward-extender.pid"
setsid "${KUBECTL_BIN}" --kubeconfig "${KCFG}" -n "${NS}" port-forward --address 127.0.0.1 svc/qos-prometheus \
  "${PROMETHEUS_LOCAL_PORT}:9090" > "${STATE}/port-forward-prometheus.log" 2>&1 < /dev/null &
echo $! > "${STATE}/port-forward-prometheus.pid"
sleep 2
{
  echo "KUBECONFIG=${KCFG}"
  echo "EXTENDER_URL=https://127.0.0.1:${EXTENDER_LOCAL_PORT}"
  echo "EXTENDER_METRICS_URL=https://127.0.0.1:${EXTENDER_LOCAL_PORT}/metrics"
  echo "EXTENDER_CA=${C}/ca.crt"
  echo "EXTENDER_CLIENT_CERT=${C}/metrics-client.crt"
  echo "EXTENDER_CLIENT_KEY=${C}/metrics-client.key"
  echo "PROMETHEUS_URL=http://127.0.0.1:${PROMETHEUS_LOCAL_PORT}"
  echo "QOS_MARKER_RESOURCE=qos.kube-qos-extender.io/managed"
} | tee "${STATE}/env"
