#!/usr/bin/env bash
# The product on kind, as users run kind: a control plane and real kind workers (containers run there) labelled
# with our node groups and flavours, the product deployed from config/kind (= config/default + the Components
# shared with config/local) through hack/deploy-local.sh, kwok in the cluster for scale nodes (and the nodes the
# autoscaler's kwok provider buys) and a Prometheus in the cluster scraping the extender pods.
#
# Usage: hack/kind-up.sh [GROUP:FLAVOUR=COUNT ...]   real kind workers, default service:m1.medium=1 batch:m1.large=1
#          (kwok:GROUP:FLAVOUR=COUNT adds COUNT kwok nodes of that group and flavour, faked by the in-cluster kwok)
#        hack/kind-up.sh --down [--purge]          delete the cluster, its port-forward and state, give the host
#                                                  back the sysctls the kind kubelets changed; --purge also removes
#                                                  the cached images hack/build-kind-node.sh made (rebuilt next run)
# Environment:
#   QOS_KIND_CLUSTER=qos-kind     cluster name (two runs with different names and states never collide: the API
#   QOS_KIND_STATE=/tmp/qos-kind  server port and Prometheus' port-forward port are chosen free at start)
#   QOS_KIND_NODE_IMAGE           the node image; default: built here offline (hack/build-kind-node.sh). With a
#                                 registry, set it to the official kindest/node:<KUBE_VERSION> and nothing is built
#   QOS_KIND_DEPLOY=config        config: the product from config/kind, kwok and Prometheus in the cluster (above);
#                                 none: the cluster and our images in its workers only, nothing of ours deployed
#                                 (no namespace, kwok or Prometheus; kwok: specs refused): what `helm install`
#                                 starts from (e2e/test_helm_install.py, phase 4 of hack/run-live-tests.sh)
# Machine quirks, detected, never assumed: a docker engine whose root lacks capabilities fails `--privileged`
# ("unable to apply caps"): if the engine is the one hack/build-image.sh started, it is restarted with
# hack/kind/runc-caps.py as its default runtime; cgroup v1 hosts get the kubelet's failCgroupV1: false.
# stdout: KEY=VALUE lines (KUBECONFIG, QOS_STATE, QOS_BIN_DIR, PROMETHEUS_URL, QOS_TOPOLOGY=kind, KIND_CLUSTER,
# KIND, and hack/deploy-local.sh's); also written to $QOS_KIND_STATE/kind.env. Progress on stderr.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER="${QOS_KIND_CLUSTER:-qos-kind}"
DEPLOY="${QOS_KIND_DEPLOY:-config}"
STATE="${QOS_KIND_STATE:-/tmp/qos-kind}"
DOCKERD_DIR="${QOS_CACHE}/dockerd"
KIND_BIN="${QOS_CACHE}/kind/${KIND_VERSION}/bin/kind"
KUBECTL_BIN="${BIN_DIR}/kubectl"
KCFG="${STATE}/kubeconfig"
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory)

stop_forward() { # the port-forward's supervisor loop is a process group of its own (setsid)
  local f="${STATE}/port-forward.pid" pid
  [[ -s "${f}" ]] || return 0
  pid="$(cat "${f}")"
  if grep -q qos-kind-port-forward "/proc/${pid}/cmdline" 2>/dev/null; then kill -- "-${pid}" 2>/dev/null || true; fi
  rm -f "${f}"
}

# The kubelets of privileged kind nodes write non-namespaced sysctls on the host (protectKernelDefaults false):
# saved before the first cluster, restored after the last. One record for the host, not one per state dir: a
# cluster started while another runs would otherwise save the values kind already changed, and restore those.
HOST_SYSCTLS="${QOS_CACHE}/kind/host-sysctls"
kind_running() { docker ps -a --filter label=io.x-k8s.kind.cluster -q 2>/dev/null | grep -q .; }
save_sysctls() {
  [[ -s "${HOST_SYSCTLS}" ]] && return 0
  if kind_running; then log "kind containers exist and no host sysctls were saved: they will not be restored"; return 0; fi
  mkdir -p "$(dirname "${HOST_SYSCTLS}")"
  sysctl "${SYSCTLS[@]}" > "${HOST_SYSCTLS}"
}
restore_sysctls() { # only once no kind container is left
  [[ -s "${HOST_SYSCTLS}" ]] || return 0
  kind_running && return 0
  local key _eq value
  while read -r key _eq value; do sysctl -q -w "${key}=${value}" >/dev/null || log "could not restore ${key}=${value}"; done \
    < "${HOST_SYSCTLS}"
  rm -f "${HOST_SYSCTLS}"
}

down() {
  stop_forward
  if [[ -x "${KIND_BIN}" ]] && "${KIND_BIN}" get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
    log "kind: deleting cluster ${CLUSTER}"
    "${KIND_BIN}" delete cluster --name "${CLUSTER}" >&2 || log "kind delete cluster ${CLUSTER} failed"
  fi
  # what kind leaves: its network once no cluster uses it (node images stay cached for the next run)
  if ! kind_running; then docker network rm kind >/dev/null 2>&1 || true; fi
  restore_sysctls
  rm -rf "${STATE}"
}

purge() {
  local images
  images="$(docker images --format '{{.Repository}}:{{.Tag}}' | grep -E '^(qos-kind-build/|qos-local/(kind-node|kwok|prometheus):)' || true)"
  if [[ -n "${images}" ]]; then
    log "purge: removing ${images//$'\n'/ }"
    # shellcheck disable=SC2086
    docker rmi ${images} >/dev/null
  fi
}

case "${1:-}" in
  --down) down; if [[ "${2:-}" == --purge ]]; then purge; fi; exit 0 ;;
  -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
esac

[[ "${DEPLOY}" == config || "${DEPLOY}" == none ]] || die "QOS_KIND_DEPLOY must be config or none, not ${DEPLOY}"
REAL=() KWOK=()
if (($# == 0)); then set -- service:m1.medium=1 batch:m1.large=1; fi
for spec in "$@"; do
  [[ "${spec}" =~ ^(kwok:)?([a-z0-9-]+):([a-z0-9.]+)=([0-9]+)$ ]] || die "bad node spec ${spec} (GROUP:FLAVOUR=COUNT)"
  flavour="${BASH_REMATCH[3]}"
  python3 -c 'import sys, yaml; sys.exit(sys.argv[2] not in {f["name"] for f in yaml.safe_load(open(sys.argv[1]))["flavours"]})' \
    "${REPO_ROOT}/config/flavours.yaml" "${flavour}" || die "unknown flavour ${flavour} (config/flavours.yaml)"
  if [[ -n "${BASH_REMATCH[1]}" ]]; then KWOK+=("${BASH_REMATCH[2]} ${flavour} ${BASH_REMATCH[4]}")
  else REAL+=("${BASH_REMATCH[2]} ${flavour} ${BASH_REMATCH[4]}"); fi
done
if [[ "${DEPLOY}" == none ]] && ((${#KWOK[@]})); then die "kwok: nodes need kwok in the cluster: not with QOS_KIND_DEPLOY=none"; fi

mkdir -p "${STATE}"
chmod 700 "${STATE}"
on_failure() {
  log "kind-up failed: logs in ${STATE}.logs, tearing down"
  rm -rf "${STATE}.logs"
  if [[ -x "${KIND_BIN}" ]]; then "${KIND_BIN}" export logs "${STATE}.logs" --name "${CLUSTER}" >/dev/null 2>&1 || true; fi
  down
}
trap 'rc=$?; if ((rc != 0)); then on_failure; fi' EXIT

# ---------------------------------------------------------------- engine, images, node image
start=${SECONDS}
"${HACK_DIR}/build-tools.sh" >&2
"${HACK_DIR}/build-image.sh" >&2  # the engine (started when none answers) and the project's images
probe_privileged() {
  docker run --rm --privileged --user 0 --network none --entrypoint /pause registry.k8s.io/pause:3.10 -v >/dev/null 2>"${STATE}/probe.err"
}
if ! probe_privileged; then
  grep -q 'apply caps' "${STATE}/probe.err" || { cat "${STATE}/probe.err" >&2; die "docker run --privileged fails"; }
  [[ -s "${DOCKERD_DIR}/dockerd.pid" ]] && kill -0 "$(cat "${DOCKERD_DIR}/dockerd.pid")" 2>/dev/null \
    || die "docker run --privileged fails (\"unable to apply caps\": this root lacks capabilities) and the engine is not hack/build-image.sh's: make hack/kind/runc-caps.py its default runtime (dockerd --add-runtime qos-runc=<path> --default-runtime qos-runc)"
  wrapper="${DOCKERD_DIR}/qos-runc"
  sed "s#@RUNC@#$(command -v runc)#" "${HACK_DIR}/kind/runc-caps.py" > "${wrapper}.tmp"
  chmod 0755 "${wrapper}.tmp"
  mv -f "${wrapper}.tmp" "${wrapper}"
  log "docker: --privileged fails here (root lacks capabilities): restarting the engine with ${wrapper} as its default runtime"
  "${HACK_DIR}/build-image.sh" --stop-engine >&2
  QOS_DOCKERD_EXTRA_ARGS="--add-runtime qos-runc=${wrapper} --default-runtime qos-runc" "${HACK_DIR}/build-image.sh" >&2
  probe_privileged || { cat "${STATE}/probe.err" >&2; die "docker run --privileged still fails with ${wrapper}"; }
fi
# kind itself and the images config/kind names (kwok, Prometheus) are built here in any case; the node image too,
# but an official one given in QOS_KIND_NODE_IMAGE is used instead (our images are then `kind load`ed below)
NODE_IMAGE="$("${HACK_DIR}/build-kind-node.sh" | sed -n 's/^KIND_NODE_IMAGE=//p')"
NODE_IMAGE="${QOS_KIND_NODE_IMAGE:-${NODE_IMAGE}}"
[[ -n "${NODE_IMAGE}" ]] || die "no node image"
log "images ready in $((SECONDS - start))s (node image ${NODE_IMAGE})"

# ---------------------------------------------------------------- cluster
save_sysctls
cgroup_v1=0
[[ "$(stat -fc %T /sys/fs/cgroup)" == cgroup2fs ]] || cgroup_v1=1
python3 - "${STATE}/cluster.yaml" "${REPO_ROOT}/config/kind/cluster.yaml" "${cgroup_v1}" "${REAL[@]}" <<'PY'
import sys, yaml
out, base, v1, specs = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4:]
cfg = yaml.safe_load(open(base))
workers = []
for spec in specs:
    group, flavour, count = spec.split()
    for _ in range(int(count)):
        workers.append({"role": "worker", "labels": {"type": "kind",
            "qos.kube-qos-extender.io/node-group": group, "node.kubernetes.io/instance-type": flavour}})
cfg["nodes"] = [n for n in cfg["nodes"] if n["role"] == "control-plane"] + workers
# The kubelets serve certificates signed by the cluster CA (serverTLSBootstrap; kind-up approves their CSRs), so
# the node agents can verify the kubelet they checkpoint through; the checkpoint API is on (ContainerCheckpoint).
kubelet = "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nserverTLSBootstrap: true\n"
if v1:  # kubelet >= 1.35 refuses cgroup v1 unless told (harmless on v2, but only added where needed)
    kubelet += "failCgroupV1: false\n"
cfg.setdefault("kubeadmConfigPatches", []).append(kubelet)
cfg.setdefault("featureGates", {})["ContainerCheckpoint"] = True
yaml.safe_dump(cfg, open(out, "w"), sort_keys=False)
PY
if ! "${KIND_BIN}" get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
  log "kind: creating cluster ${CLUSTER} (${#REAL[@]} worker groups, image ${NODE_IMAGE})"
  t=${SECONDS}
  "${KIND_BIN}" create cluster --name "${CLUSTER}" --config "${STATE}/cluster.yaml" --image "${NODE_IMAGE}" \
    --kubeconfig "${KCFG}" --wait 180s >&2
  log "kind: cluster up in $((SECONDS - t))s"
else
  "${KIND_BIN}" get kubeconfig --name "${CLUSTER}" > "${KCFG}"
fi
export KUBECONFIG="${KCFG}"
K=("${KUBECTL_BIN}" --kubeconfig "${KCFG}")
# the kubelets' serving certificates (serverTLSBootstrap): approved here, as a cluster's kubelet-serving CSR
# approver would (kube-controller-manager signs them with the cluster CA; it approves only client CSRs itself)
approve_serving() {
  local want="$1" csrs issued
  for _ in $(seq 1 90); do
    csrs="$("${K[@]}" get csr -o jsonpath='{range .items[?(@.spec.signerName=="kubernetes.io/kubelet-serving")]}{.metadata.name}{" "}{.spec.username}{" "}{.status.certificate}{"\n"}{end}')"
    while read -r name _user cert; do
      [[ -n "${name}" && -z "${cert}" ]] && "${K[@]}" certificate approve "${name}" >/dev/null
    done <<< "${csrs}"
    # done when every node's kubelet holds an issued serving certificate: counting CSRs is not enough (the
    # control plane asked twice, the count reached the node count, and a worker's later CSR stayed Pending: its
    # kubelet answered every checkpoint with a TLS internal error, CI at 74e0cdd)
    issued="$(awk 'NF >= 3 {print $2}' <<< "${csrs}" | sort -u | grep -c . || true)"
    (( issued >= want )) && return 0
    sleep 1
  done
  die "fewer than ${want} kubelets with an issued serving certificate after 90 s"
}
approve_serving "$("${K[@]}" get nodes --no-headers | grep -c .)"

# the workers' prices, as hack/real-nodes.sh and the kwok provider annotate theirs (config/flavours.yaml)
while read -r node flavour; do
  price="$(python3 -c 'import sys, yaml; print(next(f["price_per_hour"] for f in yaml.safe_load(open(sys.argv[1]))["flavours"] if f["name"] == sys.argv[2]))' \
    "${REPO_ROOT}/config/flavours.yaml" "${flavour}")"
  "${K[@]}" annotate --overwrite node "${node}" "qos.kube-qos-extender.io/price-per-hour=${price}" >/dev/null
done < <("${K[@]}" get nodes -l type=kind -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.labels.node\.kubernetes\.io/instance-type}{"\n"}{end}')

# ---------------------------------------------------------------- images the node image does not hold
t=${SECONDS}
# into the workers only: our pods never run on the control plane (kwok and Prometheus' images are in the node image)
WORKERS="$("${K[@]}" get nodes -l type=kind -o jsonpath='{.items[*].metadata.name}')"
WORKERS="${WORKERS// /,}"
"${KIND_BIN}" load image-archive "${QOS_CACHE}/images/kube-qos-extender.tar" --name "${CLUSTER}" --nodes "${WORKERS}" >&2
if [[ -n "${QOS_KIND_NODE_IMAGE:-}" ]]; then  # an official node image: our other images are loaded too
  for tar in kube-scheduler busybox; do
    "${KIND_BIN}" load image-archive "${QOS_CACHE}/images/${tar}.tar" --name "${CLUSTER}" --nodes "${WORKERS}" >&2
  done
  "${KIND_BIN}" load docker-image "qos-local/kwok:${KWOK_VERSION}" qos-local/prometheus:bookworm --name "${CLUSTER}" >&2
fi
log "kind load: $((SECONDS - t))s"

# the API server as pods reach it (the kubeconfig's 127.0.0.1 address is the host's port mapping)
APISERVER_URL="https://$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "${CLUSTER}-control-plane"):6443"
if [[ "${DEPLOY}" == none ]]; then  # the cluster as a user's: nothing of ours in it
  trap - EXIT
  {
    echo "KUBECONFIG=${KCFG}"
    echo "QOS_STATE=${STATE}"
    echo "QOS_BIN_DIR=${BIN_DIR}"
    echo "QOS_TOPOLOGY=kind"
    echo "QOS_KIND_DEPLOY=none"
    echo "KUBE_APISERVER_URL=${APISERVER_URL}"
    echo "KIND_CLUSTER=${CLUSTER}"
    echo "KIND=${KIND_BIN}"
    echo "KIND_NODE_IMAGE=${NODE_IMAGE}"
  } > "${STATE}/kind.env"
  cat "${STATE}/kind.env"
  log "kind-up: ${CLUSTER} ready in $((SECONDS - start))s (nothing deployed)"
  exit 0
fi

# ---------------------------------------------------------------- kwok nodes, kwok's stages
"${K[@]}" -n kube-system create configmap qos-kwok-stages \
  --from-file=stages.yaml="${SHARE_DIR}/kwok-stages-${KWOK_VERSION}.yaml" --dry-run=client -o yaml \
  | "${K[@]}" apply --server-side -f - >&2
for spec in "${KWOK[@]}"; do
  read -r group flavour count <<< "${spec}"
  python3 - "${REPO_ROOT}/config/flavours.yaml" "${group}" "${flavour}" "${count}" <<'PY' | "${K[@]}" apply --server-side -f - >&2
import sys, yaml
f = next(f for f in yaml.safe_load(open(sys.argv[1]))["flavours"] if f["name"] == sys.argv[3])
cpu, mem, pods = str(f["cpu"]), str(f["memory"]), str(f.get("pods", 110))
nodes = []
for i in range(int(sys.argv[4])):
    name = f"kwok-{sys.argv[2]}-{sys.argv[3].replace('.', '-')}-{i}"
    nodes.append({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name,
        "annotations": {"kwok.x-k8s.io/node": "fake", "qos.kube-qos-extender.io/price-per-hour": str(f["price_per_hour"])},
        "labels": {"type": "kwok", "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
                   "kubernetes.io/hostname": name, "qos.kube-qos-extender.io/node-group": sys.argv[2],
                   "node.kubernetes.io/instance-type": sys.argv[3]}},
        "spec": {},
        "status": {"allocatable": {"cpu": cpu, "memory": mem, "pods": pods},
                   "capacity": {"cpu": cpu, "memory": mem, "pods": pods}}})
print(yaml.safe_dump_all(nodes))
PY
done

# the kubelets Prometheus scrapes for /metrics/resource (config/kind/prometheus.yaml, job kubelet-resource)
"${K[@]}" create namespace kube-qos-system --dry-run=client -o yaml | "${K[@]}" apply --server-side -f - >&2
"${K[@]}" get nodes -l type=kind -o json | python3 -c '
import json, sys
targets = [{"targets": [next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP") + ":10250"],
            "labels": {"node": n["metadata"]["name"]}} for n in json.load(sys.stdin)["items"]]
json.dump(targets, open(sys.argv[1], "w"))' "${STATE}/kubelets.json"
"${K[@]}" -n kube-qos-system create configmap qos-prometheus-kubelets --from-file=kubelets.json="${STATE}/kubelets.json" \
  --dry-run=client -o yaml | "${K[@]}" apply --server-side -f - >&2

# ---------------------------------------------------------------- the product
CA_DIR="${STATE}/certs"
mkdir -p "${CA_DIR}"
if [[ ! -s "${CA_DIR}/ca.crt" ]]; then make_ca "${CA_DIR}/ca" "qos-kind-${CLUSTER}-ca"; fi
# the kubelets' serving CA as the agents see it: kubeadm's cluster CA (kind's kubelets serve self-signed
# certificates unless serverTLSBootstrap; the agents' checkpoint path is exercised on real nodes, not here)
docker cp "${CLUSTER}-control-plane:/etc/kubernetes/pki/ca.crt" "${STATE}/kubelet-ca.crt" >/dev/null
t=${SECONDS}
QOS_STATE="${STATE}" QOS_OVERLAY=config/kind QOS_KUBELET_CA="${STATE}/kubelet-ca.crt" QOS_BIN_DIR="${BIN_DIR}" \
  QOS_IMAGE_TAR="${QOS_CACHE}/images/kube-qos-extender.tar" "${HACK_DIR}/deploy-local.sh" > "${STATE}/deploy.env"
for d in kube-system/qos-kwok kube-qos-system/qos-prometheus; do
  "${K[@]}" -n "${d%/*}" rollout status "deployment/${d#*/}" --timeout=180s >&2
done
log "deploy: $((SECONDS - t))s"

# ---------------------------------------------------------------- Prometheus on 127.0.0.1
stop_forward
PROM_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# kubectl port-forward ends with the pod it picked (a restart, a rollout): a loop starts it again
setsid bash -c 'while :; do "$@"; sleep 1; done' qos-kind-port-forward "${KUBECTL_BIN}" --kubeconfig "${KCFG}" \
  -n kube-qos-system port-forward --address 127.0.0.1 service/qos-prometheus "${PROM_PORT}:9090" \
  > "${STATE}/port-forward.log" 2>&1 < /dev/null &
echo $! > "${STATE}/port-forward.pid"
for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:${PROM_PORT}/-/ready" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fsS "http://127.0.0.1:${PROM_PORT}/-/ready" >/dev/null || die "Prometheus not reachable through the port-forward"

trap - EXIT
{
  cat "${STATE}/deploy.env"
  echo "QOS_STATE=${STATE}"
  echo "QOS_BIN_DIR=${BIN_DIR}"
  echo "QOS_TOPOLOGY=kind"
  echo "QOS_OVERLAY=config/kind"
  echo "QOS_KUBELET_CA=${STATE}/kubelet-ca.crt"
  echo "KUBE_APISERVER_URL=${APISERVER_URL}"
  echo "KIND_CLUSTER=${CLUSTER}"
  echo "KIND=${KIND_BIN}"
  echo "KIND_NODE_IMAGE=${NODE_IMAGE}"
  echo "PROMETHEUS_URL=http://127.0.0.1:${PROM_PORT}"
} > "${STATE}/kind.env"
cat "${STATE}/kind.env"
log "kind-up: ${CLUSTER} ready in $((SECONDS - start))s"
