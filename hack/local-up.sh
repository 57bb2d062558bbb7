#!/usr/bin/env bash
# Start (or reuse) a local Kubernetes control plane bound to 127.0.0.1 only:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler (profiles default-scheduler + qos-scheduler,
#   optional HTTP extender), kwok (fake kubelets for the nodes created here) and Prometheus.
#
# Usage: hack/local-up.sh [[real:][GROUP:]FLAVOUR=COUNT ...]
#   e.g.  hack/local-up.sh m1.medium=2 batch:m1.large=1      (GROUP is service or batch; default service)
#   Each GROUP:FLAVOUR pair given is set to exactly COUNT kwok nodes; pairs not given are left as they are.
#   With `real:` the nodes are real: a kubelet + containerd + kube-proxy each, in a network namespace of their
#   own (hack/real-nodes.sh: topology, addresses, images; needs root and hack/build-image.sh's images).
#   Flavours come from config/flavours.yaml when present, else m1.small/medium/large/xlarge built-ins.
#
# stdout: KEY=VALUE lines (also written to $QOS_STATE/env); everything else goes to stderr. Typical use:
#   set -a; eval "$(hack/local-up.sh m1.medium=2)"; set +a
#
# Environment (defaults):
#   QOS_STATE=/tmp/qos-local     state dir: pids, logs, certs, kubeconfigs, etcd + prometheus data
#   QOS_CACHE=~/.cache/kube-qos-extender   binaries (hack/build-tools.sh runs first; it is a no-op when built)
#   QOS_BIN_DIR=                 use the binaries in this dir and skip build-tools.sh
#   QOS_WITH_EXTENDER=0          1: add the extender to the scheduler config and Prometheus
#   QOS_START_EXTENDER=$QOS_WITH_EXTENDER   1: also start the real extender (.venv/bin/python -m extender.cli
#                                serve) on EXTENDER_URL's port with the generated $QOS_STATE/config/extender.yaml;
#                                0: bring your own (hack/smoke-test.sh's stub)
#   QOS_EXTENDER_CONFIG=         a settings file the generated one is layered over (server/tls/kubeconfig are
#                                overridden; none: the defaults); QOS_PYTHON=.venv/bin/python runs it
#   QOS_WITH_CONTROLLER=1        the started extender also runs the QoS controller (controller.enabled, instance
#                                "default", Lease kube-system/kube-qos-extender-default): qos-scheduler pods are
#                                gated by the admission webhook (hack/manifests) and released in increasing Q
#   EXTENDER_URL=https://127.0.0.1:8443   extender urlPrefix (verbs filter/prioritize/preempt/bind)
#   EXTENDER_METRICS_URL=$EXTENDER_URL/metrics
#   QOS_EXTENDER_MANAGED_RESOURCE   the extender is only called for pods requesting that extended resource
#                                (see hack/README.md); default qos.kube-qos-extender.io/managed when the real
#                                extender is started, else unset (empty: every pod reaches the extender)
#   QOS_EXTENDER_WEIGHT=5        extender prioritize weight (score 0..10 x weight x 10; see README)
#   QOS_EXTENDER_IGNORABLE=false QOS_EXTENDER_TIMEOUT=45s QOS_EXTENDER_NODE_CACHE=true (nodeCacheCapable)
#   QOS_EXTENDER_BIND_VERB=bind  empty: no bindVerb, kube-scheduler binds with its own client
#   QOS_NULL_EXTENDER_PORT=       lab only (bench/e2e_throughput.py --null): a second extender entry, plain HTTP on
#                                 127.0.0.1:PORT, for pods requesting QOS_NULL_EXTENDER_RESOURCE
#                                 (bench.kube-qos-extender.io/null); whoever sets it runs the server
#   QOS_EXTENDER_LOOPBACK_PORT=   when set, the extender also serves the verbs over plain HTTP on
#                                127.0.0.1:PORT (server.loopback_verbs_port) and kube-scheduler calls that
#                                (the sidecar topology's transport); TLS stays for admission and /metrics
#   QOS_MANIFESTS_DIR=hack/manifests   every *.yaml there is applied once the apiserver is ready, after
#                                ${VAR} substitution (QOS_CA_BUNDLE = base64 CA, EXTENDER_URL, EXTENDER_HOST,
#                                EXTENDER_PORT, QOS_STATE and any exported variable); config/base's
#                                PriorityClasses and the extender's ClusterRole are applied first
#   QOS_HOST_QOS_PROFILE=1      0: the host kube-scheduler serves default-scheduler only, so that config/'s
#                                in-cluster qos-scheduler Deployment owns the qos-scheduler profile (the
#                                deployed-for-real e2e, hack/deploy-local.sh); use with QOS_MANIFESTS_DIR=none
#   QOS_NODE_LIFECYCLE=1         0: run kube-controller-manager with --controllers=*,-nodelifecycle
#   QOS_KWOK_USAGE=1             0: kwok emulates no usage (1: hack/kwok-usage.yaml, scraped by Prometheus)
#   QOS_KWOK_NODE_LEASE_SECONDS=40   kwok's node Lease duration (renewed every quarter of it, per node: 500
#                                writes/s at 5,000 nodes); 0: no node Leases at all (the scale benches): the node
#                                lifecycle controller then judges nodes by kwok's status heartbeats (every 10-20
#                                min) and runs with --node-monitor-grace-period=1h. Keep the controller on: it
#                                removes the not-ready taint every new node is admitted with.
#   QOS_ETCD_FSYNC=0             1: let etcd fsync (default runs it with --unsafe-no-fsync: throwaway state)
#   QOS_SCHEDULER_QPS=50 QOS_SCHEDULER_BURST=100   scheduler client rate limit (raise for throughput runs)
#   ports: QOS_ETCD_PORT=23790 QOS_ETCD_PEER_PORT=23800 QOS_APISERVER_PORT=6443 QOS_SCHEDULER_PORT=10259
#          QOS_CONTROLLER_MANAGER_PORT=10257 QOS_KWOK_PORT=10247 QOS_PROMETHEUS_PORT=9090
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0; fi
T0=${SECONDS}
QOS_STATE="${QOS_STATE:-/tmp/qos-local}"
QOS_WITH_EXTENDER="${QOS_WITH_EXTENDER:-0}"
EXTENDER_URL="${EXTENDER_URL:-https://127.0.0.1:8443}"
EXTENDER_URL="${EXTENDER_URL%/}"
EXTENDER_METRICS_URL="${EXTENDER_METRICS_URL:-${EXTENDER_URL}/metrics}"
QOS_START_EXTENDER="${QOS_START_EXTENDER:-${QOS_WITH_EXTENDER}}"
if [[ "${QOS_START_EXTENDER}" == 1 ]]; then QOS_WITH_EXTENDER=1; fi
QOS_MARKER_RESOURCE=qos.kube-qos-extender.io/managed
QOS_WITH_CONTROLLER="${QOS_WITH_CONTROLLER:-1}"
if [[ "${QOS_START_EXTENDER}" == 1 ]]; then
  QOS_EXTENDER_MANAGED_RESOURCE="${QOS_EXTENDER_MANAGED_RESOURCE-${QOS_MARKER_RESOURCE}}"
else
  QOS_EXTENDER_MANAGED_RESOURCE="${QOS_EXTENDER_MANAGED_RESOURCE:-}"
fi
QOS_EXTENDER_WEIGHT="${QOS_EXTENDER_WEIGHT:-5}"
QOS_EXTENDER_NODE_CACHE="${QOS_EXTENDER_NODE_CACHE:-true}"
QOS_EXTENDER_IGNORABLE="${QOS_EXTENDER_IGNORABLE:-false}"
QOS_EXTENDER_TIMEOUT="${QOS_EXTENDER_TIMEOUT:-45s}"
QOS_EXTENDER_BIND_VERB="${QOS_EXTENDER_BIND_VERB-bind}"
QOS_EXTENDER_LOOPBACK_PORT="${QOS_EXTENDER_LOOPBACK_PORT:-}"
QOS_NULL_EXTENDER_PORT="${QOS_NULL_EXTENDER_PORT:-}"
QOS_NULL_EXTENDER_RESOURCE="${QOS_NULL_EXTENDER_RESOURCE:-bench.kube-qos-extender.io/null}"
[[ -z "${QOS_NULL_EXTENDER_PORT}" || "${QOS_NULL_EXTENDER_PORT}" =~ ^[0-9]+$ ]] \
  || die "QOS_NULL_EXTENDER_PORT must be a port number, got ${QOS_NULL_EXTENDER_PORT}"
[[ -z "${QOS_EXTENDER_LOOPBACK_PORT}" || "${QOS_EXTENDER_LOOPBACK_PORT}" =~ ^[0-9]+$ ]] \
  || die "QOS_EXTENDER_LOOPBACK_PORT must be a port number, got ${QOS_EXTENDER_LOOPBACK_PORT}"
QOS_NODE_LIFECYCLE="${QOS_NODE_LIFECYCLE:-1}"
QOS_KWOK_NODE_LEASE_SECONDS="${QOS_KWOK_NODE_LEASE_SECONDS:-40}"
[[ "${QOS_KWOK_NODE_LEASE_SECONDS}" =~ ^[0-9]+$ ]] \
  || die "QOS_KWOK_NODE_LEASE_SECONDS must be a number of seconds, got ${QOS_KWOK_NODE_LEASE_SECONDS}"
QOS_HOST_QOS_PROFILE="${QOS_HOST_QOS_PROFILE:-1}"
QOS_SCHEDULER_QPS="${QOS_SCHEDULER_QPS:-50}"
QOS_SCHEDULER_BURST="${QOS_SCHEDULER_BURST:-100}"
ETCD_PORT="${QOS_ETCD_PORT:-23790}"
ETCD_PEER_PORT="${QOS_ETCD_PEER_PORT:-23800}"
APISERVER_PORT="${QOS_APISERVER_PORT:-6443}"
SCHEDULER_PORT="${QOS_SCHEDULER_PORT:-10259}"
CONTROLLER_MANAGER_PORT="${QOS_CONTROLLER_MANAGER_PORT:-10257}"
KWOK_PORT="${QOS_KWOK_PORT:-10247}"
PROMETHEUS_PORT="${QOS_PROMETHEUS_PORT:-9090}"
HOST=127.0.0.1
EXTENDER_HOSTPORT="${EXTENDER_URL#*://}"
EXTENDER_HOSTPORT="${EXTENDER_HOSTPORT%%/*}"
EXTENDER_HOST="${EXTENDER_HOSTPORT%:*}"
EXTENDER_PORT="${EXTENDER_HOSTPORT##*:}"
[[ "${EXTENDER_PORT}" =~ ^[0-9]+$ ]] || die "EXTENDER_URL must name a port (https://127.0.0.1:PORT), got ${EXTENDER_URL}"
QOS_PYTHON="${QOS_PYTHON:-${REPO_ROOT}/.venv/bin/python}"
QOS_EXTENDER_CONFIG="${QOS_EXTENDER_CONFIG:-}"
QOS_MANIFESTS_DIR="${QOS_MANIFESTS_DIR:-${HACK_DIR}/manifests}"

CERTS="${QOS_STATE}/certs"
KCFG="${QOS_STATE}/kubeconfig"
LOGS="${QOS_STATE}/logs"
PIDS="${QOS_STATE}/pids"
CONF="${QOS_STATE}/config"
ADMIN_KUBECONFIG="${KCFG}/admin.kubeconfig"

# ---------------------------------------------------------------- binaries
# build-tools.sh is idempotent (0.1 s when everything is built for the pinned versions); QOS_BIN_DIR
# skips it and uses binaries from elsewhere.
if [[ -n "${QOS_BIN_DIR:-}" ]]; then
  BIN_DIR="${QOS_BIN_DIR}"
else
  BIN_DIR="$("${HACK_DIR}/build-tools.sh" | tail -n1)"
fi
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok prometheus; do
  [[ -x "${BIN_DIR}/${b}" ]] || die "missing ${BIN_DIR}/${b} (run hack/build-tools.sh)"
done
KUBECTL=("${BIN_DIR}/kubectl" --kubeconfig "${ADMIN_KUBECONFIG}")
KWOK_STAGES="${SHARE_DIR}/kwok-stages-${KWOK_VERSION}.yaml"
[[ -s "${KWOK_STAGES}" ]] || die "missing ${KWOK_STAGES} (run hack/build-tools.sh)"
command -v openssl >/dev/null || die "openssl is required"
command -v curl >/dev/null || die "curl is required"

mkdir -p "${CERTS}" "${KCFG}" "${LOGS}" "${PIDS}" "${CONF}"
chmod 700 "${QOS_STATE}"

# ---------------------------------------------------------------- flavours and node arguments
# name cpu memory pods price; config/flavours.yaml (if present) overrides the built-ins.
declare -A FL_CPU=([m1.small]=1 [m1.medium]=2 [m1.large]=4 [m1.xlarge]=8)
declare -A FL_MEM=([m1.small]=2Gi [m1.medium]=4Gi [m1.large]=8Gi [m1.xlarge]=16Gi)
declare -A FL_PODS=([m1.small]=110 [m1.medium]=110 [m1.large]=110 [m1.xlarge]=110)
declare -A FL_PRICE=([m1.small]=0.05 [m1.medium]=0.10 [m1.large]=0.20 [m1.xlarge]=0.40)
FLAVOURS_FILE="${QOS_FLAVOURS_FILE:-${REPO_ROOT}/config/flavours.yaml}"
if [[ -f "${FLAVOURS_FILE}" ]]; then
  # Accepts {flavours: [{name, cpu, memory, pods?, price|price_per_hour?}]}, {flavours: {name: {...}}}
  # or a top-level {name: {...}} mapping. Numeric memory is taken as GiB.
  parsed="$(python3 - "${FLAVOURS_FILE}" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1])) or {}
if isinstance(doc, dict) and "flavours" in doc:
    doc = doc["flavours"]
items = doc.items() if isinstance(doc, dict) else [(d.get("name"), d) for d in doc]
for name, d in items:
    if not name or not isinstance(d, dict):
        continue
    cpu = d.get("cpu", d.get("vcpus"))
    mem = d.get("memory", d.get("mem", d.get("ram")))
    if cpu is None or mem is None:
        continue
    if isinstance(mem, (int, float)):
        mem = f"{mem}Gi"
    pods = d.get("pods", 110)
    price = d.get("price", d.get("price_per_hour", d.get("pricePerHour", 0)))
    print(name, cpu, str(mem).replace(" ", ""), pods, price)
PY
)" || die "cannot parse ${FLAVOURS_FILE}"
  if [[ -n "${parsed}" ]]; then
    FL_CPU=() FL_MEM=() FL_PODS=() FL_PRICE=()
    while read -r n c m p pr; do
      FL_CPU[${n}]=${c}; FL_MEM[${n}]=${m}; FL_PODS[${n}]=${p}; FL_PRICE[${n}]=${pr}
    done <<< "${parsed}"
    log "flavours from ${FLAVOURS_FILE}: ${!FL_CPU[*]}"
  else
    log "WARNING: no flavours understood in ${FLAVOURS_FILE}; using built-ins"
  fi
fi

NODE_SPECS=()  # group flavour count
REAL_SPECS=()  # [group:]flavour=count, for hack/real-nodes.sh
for arg in "$@"; do
  if [[ "${arg}" == real:* ]]; then
    REAL_SPECS+=("${arg#real:}")
    [[ "${arg#real:}" =~ ^(([a-z]+):)?([A-Za-z0-9._-]+)=([0-9]+)$ ]] || die "bad node argument '${arg}'"
    [[ "${BASH_REMATCH[2]:-service}" == service || "${BASH_REMATCH[2]}" == batch ]] \
      || die "node group must be service or batch: '${arg}'"
    [[ -n "${FL_CPU[${BASH_REMATCH[3]}]:-}" ]] || die "unknown flavour '${BASH_REMATCH[3]}' (known: ${!FL_CPU[*]})"
    continue
  fi
  [[ "${arg}" =~ ^(([a-z]+):)?([A-Za-z0-9._-]+)=([0-9]+)$ ]] || die "bad node argument '${arg}' (want [group:]flavour=count)"
  group="${BASH_REMATCH[2]:-service}" flavour="${BASH_REMATCH[3]}" count="${BASH_REMATCH[4]}"
  [[ "${group}" == service || "${group}" == batch ]] || die "node group must be service or batch: '${arg}'"
  [[ -n "${FL_CPU[${flavour}]:-}" ]] || die "unknown flavour '${flavour}' (known: ${!FL_CPU[*]})"
  NODE_SPECS+=("${group} ${flavour} ${count}")
done

# ---------------------------------------------------------------- process helpers
pid_of() { # <name> -> pid if our process is alive
  local f="${PIDS}/$1.pid" pid exe
  [[ -s "${f}" ]] || return 1
  pid="$(cat "${f}")"
  kill -0 "${pid}" 2>/dev/null || return 1
  exe="$(readlink -f "/proc/${pid}/exe" 2>/dev/null || true)"
  [[ "${exe}" == "$(readlink -f "$(cat "${PIDS}/$1.exe" 2>/dev/null || echo /nonexistent)")" ]] || return 1
  echo "${pid}"
}

port_owner() { # <port> -> description of the listener, empty if free
  ss -Hltnp "sport = :$1" 2>/dev/null | awk '{print $4, $6}' | head -n1
}

check_port() { # <name> <port>
  local owner
  owner="$(port_owner "$2")"
  if [[ -n "${owner}" ]]; then
    die "$1: port $2 is already in use by something else (${owner}); stop it or set the QOS_*_PORT variable"
  fi
}

stop_component() { # <name>
  local pid
  pid="$(pid_of "$1")" || { rm -f "${PIDS}/$1.pid"; return 0; }
  log "$1: stopping pid ${pid}"
  kill "${pid}" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
  kill -9 "${pid}" 2>/dev/null || true
  rm -f "${PIDS}/$1.pid"
}

# start_component <name> <port> <config-fingerprint-file|""> <binary> args...
# Reuses a running instance unless its fingerprint file changed since it was started.
start_component() {
  local name="$1" port="$2" fp="$3" bin="$4"
  shift 4
  local sum=""
  if [[ -n "${fp}" ]]; then sum="$(sha256sum < "${fp}" | cut -c1-16)"; fi
  if pid="$(pid_of "${name}")"; then
    if [[ "$(cat "${PIDS}/${name}.sum" 2>/dev/null)" == "${sum}" ]]; then
      log "${name}: already running (pid ${pid}), reusing"
      return 0
    fi
    log "${name}: configuration changed, restarting"
    stop_component "${name}"
    for _ in $(seq 1 50); do [[ -z "$(port_owner "${port}")" ]] && break; sleep 0.1; done
  fi
  check_port "${name}" "${port}"
  echo "${sum}" > "${PIDS}/${name}.sum"
  readlink -f "${bin}" > "${PIDS}/${name}.exe"
  # setsid: own session, so the daemons outlive this script and the shell job that ran it.
  setsid "${bin}" "$@" >> "${LOGS}/${name}.log" 2>&1 < /dev/null &
  echo $! > "${PIDS}/${name}.pid"
  log "${name}: started pid $! (log ${LOGS}/${name}.log)"
}

wait_for() { # <name> <timeout s> <command...>
  local name="$1" timeout="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ! pid_of "${name}" >/dev/null; then
      tail -n 20 "${LOGS}/${name}.log" >&2 || true
      die "${name} exited; see ${LOGS}/${name}.log"
    fi
    if ((SECONDS >= deadline)); then
      tail -n 20 "${LOGS}/${name}.log" >&2 || true
      die "${name} not ready after ${timeout}s; see ${LOGS}/${name}.log"
    fi
    sleep 0.2
  done
}

curl_ok() { # <url> [curl args] -- body must be "ok"
  local body
  body="$(curl -sS --max-time 2 "$@")" && [[ "${body}" == ok ]]
}

# ---------------------------------------------------------------- certificates (openssl)
gen_key() { [[ -s "$1" ]] || openssl genrsa -out "$1" 2048 2>/dev/null; }

gen_cert() { # <name> <subject> <extendedKeyUsage> [subjectAltName]
  [[ -s "${CERTS}/$1.crt" ]] && return 0
  sign_cert "${CERTS}/ca" "${CERTS}/$1" "$2" "$3" "${4:-}"
}

if [[ ! -s "${CERTS}/ca.crt" ]]; then
  log "certs: generating CA and certificates in ${CERTS}"
  make_ca "${CERTS}/ca" kube-qos-local-ca
fi
LOCAL_SAN="IP:127.0.0.1,DNS:localhost"
# 10.250.0.2: the apiserver as real nodes and pods reach it (hack/real-nodes.sh's relay)
gen_cert apiserver "/CN=kube-apiserver" serverAuth \
  "${LOCAL_SAN},IP:10.96.0.1,IP:10.250.0.2,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
gen_cert components-serving "/CN=localhost" serverAuth "${LOCAL_SAN}"
gen_cert admin "/O=system:masters/CN=kube-admin" clientAuth
gen_cert kube-scheduler "/CN=system:kube-scheduler" clientAuth
gen_cert kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
gen_cert kwok "/O=system:masters/CN=kwok-controller" clientAuth
# The apiserver's identity towards kubelets (logs, exec, checkpoint proxying): group system:masters is
# authorised by every kubelet's webhook authorizer.
gen_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
# Front-proxy (request-header) CA and client: the aggregation layer; without them every component logs
# "missing content for CA bundle ... requestheader-client-ca-file" forever.
[[ -s "${CERTS}/front-proxy-ca.crt" ]] || make_ca "${CERTS}/front-proxy-ca" kube-qos-local-front-proxy-ca
[[ -s "${CERTS}/front-proxy-client.crt" ]] \
  || sign_cert "${CERTS}/front-proxy-ca" "${CERTS}/front-proxy-client" "/CN=front-proxy-client" clientAuth
gen_cert extender-serving "/CN=kube-qos-extender" serverAuth "${LOCAL_SAN}"
# Two client identities of the same CA, each allowed on its own paths only (server.tls.verb_clients /
# metrics_clients): kube-scheduler's for the verbs, Prometheus' (and the tests' scrapes) for /metrics.
gen_cert extender-client "/O=kube-qos-extender-clients/CN=kube-scheduler-extender-client" clientAuth
gen_cert extender-metrics-client "/O=kube-qos-extender-clients/CN=prometheus-extender-client" clientAuth
# The extender's own API identity: user qos-extender, bound to config/base's least-privilege ClusterRole
# (hack/manifests/00-qos-extender-local-rbac.yaml), so the local cluster exercises the shipped RBAC.
gen_cert qos-extender "/O=kube-qos-extender/CN=qos-extender" clientAuth
if [[ ! -s "${CERTS}/sa.key" ]]; then
  gen_key "${CERTS}/sa.key"
  openssl rsa -in "${CERTS}/sa.key" -pubout -out "${CERTS}/sa.pub" 2>/dev/null
fi
chmod 600 "${CERTS}"/*.key

write_kubeconfig() { # <file> <cert name>
  kubeconfig "https://${HOST}:${APISERVER_PORT}" "${CERTS}/ca.crt" "$2" "${CERTS}/$2" > "$1"
}
for u in admin kube-scheduler kube-controller-manager kwok qos-extender; do
  write_kubeconfig "${KCFG}/${u}.kubeconfig" "${u}"
done

# ---------------------------------------------------------------- configuration files
# kube-scheduler: default-scheduler + qos-scheduler; extenders are global (all profiles) -- see README.
{
  cat <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: ${KCFG}/kube-scheduler.kubeconfig
  qps: ${QOS_SCHEDULER_QPS}
  burst: ${QOS_SCHEDULER_BURST}
leaderElection:
  leaderElect: false
profiles:
- schedulerName: default-scheduler
EOF
  if [[ "${QOS_HOST_QOS_PROFILE}" == 1 ]]; then
    cat <<EOF
- schedulerName: qos-scheduler
  # The extender ranks only the nodes kube-scheduler samples: 50 %, as config/base/kube-scheduler.yaml (why there).
  percentageOfNodesToScore: 50
  # Packing must win in this profile: the in-tree scores that prefer spreading (LeastAllocated,
  # BalancedAllocation, system-default topology spreading) are switched off, so the extender's BFD /
  # time-bin BFD ranks decide among feasible nodes (filters are unchanged; explicit topologySpreadConstraints
  # are still honoured). See README "Scheduler configuration".
  plugins:
    score:
      disabled:
      - name: NodeResourcesBalancedAllocation
      - name: NodeResourcesFit
  pluginConfig:
  - name: PodTopologySpread
    args:
      defaultingType: List
      defaultConstraints: []
EOF
  fi
  if [[ "${QOS_WITH_EXTENDER}" == 1 ]]; then
    cat <<EOF
extenders:
EOF
    if [[ -n "${QOS_EXTENDER_LOOPBACK_PORT}" ]]; then
      cat <<EOF
- urlPrefix: http://127.0.0.1:${QOS_EXTENDER_LOOPBACK_PORT}
  enableHTTPS: false
EOF
    else
      cat <<EOF
- urlPrefix: ${EXTENDER_URL}
  enableHTTPS: true
  tlsConfig:
    caFile: ${CERTS}/ca.crt
    certFile: ${CERTS}/extender-client.crt
    keyFile: ${CERTS}/extender-client.key
EOF
    fi
    cat <<EOF
  filterVerb: filter
  prioritizeVerb: prioritize
  preemptVerb: preempt
EOF
    [[ -z "${QOS_EXTENDER_BIND_VERB}" ]] || echo "  bindVerb: ${QOS_EXTENDER_BIND_VERB}"
    cat <<EOF
  weight: ${QOS_EXTENDER_WEIGHT}
  nodeCacheCapable: ${QOS_EXTENDER_NODE_CACHE}
  httpTimeout: ${QOS_EXTENDER_TIMEOUT}
  ignorable: ${QOS_EXTENDER_IGNORABLE}
EOF
    if [[ -n "${QOS_EXTENDER_MANAGED_RESOURCE}" ]]; then
      cat <<EOF
  managedResources:
  - name: ${QOS_EXTENDER_MANAGED_RESOURCE}
    ignoredByScheduler: true
EOF
    fi
  fi
  if [[ -n "${QOS_NULL_EXTENDER_PORT}" ]]; then
    # Lab only (bench/e2e_throughput.py --null): an extender that decides nothing, called only for pods that
    # request its resource, to measure what the extender protocol itself costs here.
    [[ "${QOS_WITH_EXTENDER}" == 1 ]] || echo "extenders:"
    cat <<EOF
- urlPrefix: http://127.0.0.1:${QOS_NULL_EXTENDER_PORT}
  enableHTTPS: false
  filterVerb: filter
  bindVerb: bind
  weight: 1
  nodeCacheCapable: true
  httpTimeout: 45s
  ignorable: false
  managedResources:
  - name: ${QOS_NULL_EXTENDER_RESOURCE}
    ignoredByScheduler: true
EOF
  fi
} > "${CONF}/kube-scheduler.yaml"

url_hostport() { local u="${1#*://}"; echo "${u%%/*}"; }
url_path() { local u="${1#*://}"; [[ "${u}" == */* ]] && echo "/${u#*/}" || echo /; }
url_scheme() { echo "${1%%://*}"; }

{
  cat <<EOF
global:
  scrape_interval: ${QOS_PROMETHEUS_SCRAPE_INTERVAL:-5s}
  evaluation_interval: ${QOS_PROMETHEUS_SCRAPE_INTERVAL:-5s}
scrape_configs:
- job_name: prometheus
  static_configs:
  - targets: ['${HOST}:${PROMETHEUS_PORT}']
- job_name: kube-apiserver
  scheme: https
  tls_config: {ca_file: ${CERTS}/ca.crt, cert_file: ${CERTS}/admin.crt, key_file: ${CERTS}/admin.key}
  static_configs:
  - targets: ['${HOST}:${APISERVER_PORT}']
- job_name: kube-scheduler
  scheme: https
  tls_config: {ca_file: ${CERTS}/ca.crt, cert_file: ${CERTS}/admin.crt, key_file: ${CERTS}/admin.key}
  static_configs:
  - targets: ['${HOST}:${SCHEDULER_PORT}']
- job_name: kube-controller-manager
  scheme: https
  tls_config: {ca_file: ${CERTS}/ca.crt, cert_file: ${CERTS}/admin.crt, key_file: ${CERTS}/admin.key}
  static_configs:
  - targets: ['${HOST}:${CONTROLLER_MANAGER_PORT}']
- job_name: kwok
  static_configs:
  - targets: ['${HOST}:${KWOK_PORT}']
EOF
  if [[ "${QOS_KWOK_USAGE:-1}" == 1 ]]; then
    # kwok's emulated kubelet /metrics/resource per node (hack/kwok-usage.yaml); undeclared usage is dropped.
    cat <<EOF
- job_name: kwok-resource
  scrape_interval: 10s
  http_sd_configs: [{url: 'http://${HOST}:${KWOK_PORT}/discovery/prometheus', refresh_interval: 10s}]
  relabel_configs:
  - {source_labels: [__metrics_path__], regex: '/metrics/nodes/([^/]+)/metrics/resource', target_label: node}
  metric_relabel_configs:
  - {source_labels: [kwok_usage_declared], regex: 'false', action: drop}
  - {regex: kwok_usage_declared, action: labeldrop}
EOF
  fi
  if [[ "${QOS_WITH_EXTENDER}" == 1 ]]; then
    cat <<EOF
- job_name: kube-qos-extender
  scheme: $(url_scheme "${EXTENDER_METRICS_URL}")
  metrics_path: $(url_path "${EXTENDER_METRICS_URL}")
  tls_config: {ca_file: ${CERTS}/ca.crt, cert_file: ${CERTS}/extender-metrics-client.crt, key_file: ${CERTS}/extender-metrics-client.key}
  static_configs:
  - targets: ['$(url_hostport "${EXTENDER_METRICS_URL}")']
EOF
  fi
  if ((${#REAL_SPECS[@]})) || [[ -s "${QOS_STATE}/real-nodes" ]]; then
    # config/'s extender running in pods on real nodes (hack/deploy-local.sh), scraped at the pod IP (routed
    # to the nodes' namespaces) over mTLS with a client certificate of the local CA; the serving certificate
    # names the Service, not the pod IP. Debian's Prometheus has no kubernetes_sd_configs: the targets come from
    # hack/prom_pod_sd.py (started by hack/real-nodes.sh), what a ServiceMonitor would select.
    cat <<EOF
- job_name: kube-qos-extender-in-cluster
  scheme: https
  file_sd_configs:
  - files: ['${CONF}/in-cluster-extender-targets.json']
    refresh_interval: 5s
  tls_config:
    ca_file: ${CERTS}/ca.crt
    cert_file: ${CERTS}/extender-metrics-client.crt
    key_file: ${CERTS}/extender-metrics-client.key
    server_name: qos-extender.kube-qos-system.svc
EOF
    # The real kubelets' resource metrics (container_cpu_usage_seconds_total, container_memory_working_set_bytes
    # per namespace/pod/container): what extender/kube/usage.py reads for the slack controller (issue 16). The
    # serving certificates are signed by the local CA for the node address; the admin client certificate passes
    # the kubelets' webhook authorisation (nodes/metrics). Targets from hack/real-nodes.sh (file_sd, rewritten as
    # nodes come and go), labelled node=<name>.
    cat <<EOF
- job_name: kubelet-resource
  scheme: https
  metrics_path: /metrics/resource
  scrape_interval: 5s
  file_sd_configs:
  - files: ['${CONF}/real-kubelet-targets.json']
    refresh_interval: 5s
  tls_config: {ca_file: ${CERTS}/ca.crt, cert_file: ${CERTS}/admin.crt, key_file: ${CERTS}/admin.key}
EOF
  fi
} > "${CONF}/prometheus.yml"

# ---------------------------------------------------------------- start
CA="${CERTS}/ca.crt"
ADMIN_CURL=(--cacert "${CA}" --cert "${CERTS}/admin.crt" --key "${CERTS}/admin.key")

start_component prometheus "${PROMETHEUS_PORT}" "${CONF}/prometheus.yml" "${BIN_DIR}/prometheus" \
  --config.file="${CONF}/prometheus.yml" \
  --storage.tsdb.path="${QOS_STATE}/prometheus" \
  --storage.tsdb.retention.time=2d \
  --web.listen-address="${HOST}:${PROMETHEUS_PORT}" \
  --web.enable-lifecycle

ETCD_EXTRA=()
if [[ "${QOS_ETCD_FSYNC:-0}" != 1 ]]; then ETCD_EXTRA+=(--unsafe-no-fsync); fi
start_component etcd "${ETCD_PORT}" "" "${BIN_DIR}/etcd" \
  --name qos-local \
  --data-dir "${QOS_STATE}/etcd" \
  --listen-client-urls "http://${HOST}:${ETCD_PORT}" \
  --advertise-client-urls "http://${HOST}:${ETCD_PORT}" \
  --listen-peer-urls "http://${HOST}:${ETCD_PEER_PORT}" \
  --initial-advertise-peer-urls "http://${HOST}:${ETCD_PEER_PORT}" \
  --initial-cluster "qos-local=http://${HOST}:${ETCD_PEER_PORT}" \
  --initial-cluster-state new \
  --quota-backend-bytes 8589934592 \
  --snapshot-count 10000 \
  "${ETCD_EXTRA[@]}"
wait_for etcd 30 bash -c "curl -sS --max-time 2 http://${HOST}:${ETCD_PORT}/health | grep -q '\"health\":\"true\"'"

start_component kube-apiserver "${APISERVER_PORT}" "" "${BIN_DIR}/kube-apiserver" \
  --etcd-servers="http://${HOST}:${ETCD_PORT}" \
  --bind-address="${HOST}" \
  --secure-port="${APISERVER_PORT}" \
  --advertise-address="${HOST}" \
  --endpoint-reconciler-type=none \
  --tls-cert-file="${CERTS}/apiserver.crt" \
  --tls-private-key-file="${CERTS}/apiserver.key" \
  --client-ca-file="${CA}" \
  --requestheader-client-ca-file="${CERTS}/front-proxy-ca.crt" \
  --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User \
  --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="${CERTS}/front-proxy-client.crt" \
  --proxy-client-key-file="${CERTS}/front-proxy-client.key" \
  --authorization-mode=Node,RBAC \
  --service-account-key-file="${CERTS}/sa.pub" \
  --service-account-signing-key-file="${CERTS}/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.96.0.0/16 \
  --allow-privileged=true \
  --enable-aggregator-routing=true \
  --kubelet-client-certificate="${CERTS}/apiserver-kubelet-client.crt" \
  --kubelet-client-key="${CERTS}/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="${CA}" \
  --kubelet-preferred-address-types=InternalIP \
  --max-requests-inflight=800 \
  --max-mutating-requests-inflight=400 \
  --profiling=false
wait_for kube-apiserver 90 curl_ok "https://${HOST}:${APISERVER_PORT}/readyz" "${ADMIN_CURL[@]}"
log "kube-apiserver: ready ($((SECONDS - T0))s)"

# ---------------------------------------------------------------- cluster manifests (hook)
# config/base's cluster-scoped objects the local topology needs, then every hack/manifests/*.yaml (other
# components drop theirs there, e.g. a MutatingWebhookConfiguration), with ${VAR} substituted.
QOS_CA_BUNDLE="$(base64 -w0 < "${CERTS}/ca.crt")"
export QOS_CA_BUNDLE EXTENDER_URL EXTENDER_HOST EXTENDER_PORT QOS_STATE QOS_MARKER_RESOURCE
apply_manifest() { # <file>
  python3 -c 'import os, string, sys; sys.stdout.write(string.Template(open(sys.argv[1]).read()).safe_substitute(os.environ))' "$1" \
    | "${KUBECTL[@]}" apply --server-side --force-conflicts --field-manager=qos-local-up -f - >/dev/null \
    || die "cannot apply $1"
  log "applied $1"
}
for f in "${REPO_ROOT}/config/base/priorityclasses.yaml" "${REPO_ROOT}/config/base/clusterrole.yaml"; do
  if [[ -f "${f}" ]]; then apply_manifest "${f}"; fi
done
if [[ -d "${QOS_MANIFESTS_DIR}" ]]; then
  for f in "${QOS_MANIFESTS_DIR}"/*.yaml; do
    if [[ -f "${f}" ]]; then apply_manifest "${f}"; fi
  done
fi

KCM_CONTROLLERS='*'
if [[ "${QOS_NODE_LIFECYCLE}" != 1 ]]; then KCM_CONTROLLERS='*,-nodelifecycle'; fi
KCM_EXTRA=()
if [[ "${QOS_KWOK_NODE_LEASE_SECONDS}" == 0 ]]; then KCM_EXTRA+=(--node-monitor-grace-period=1h); fi
echo "${KCM_CONTROLLERS} ${KCM_EXTRA[*]}" > "${CONF}/kube-controller-manager.controllers"
start_component kube-controller-manager "${CONTROLLER_MANAGER_PORT}" "${CONF}/kube-controller-manager.controllers" \
  "${BIN_DIR}/kube-controller-manager" \
  --kubeconfig="${KCFG}/kube-controller-manager.kubeconfig" \
  --authentication-kubeconfig="${KCFG}/kube-controller-manager.kubeconfig" \
  --authorization-kubeconfig="${KCFG}/kube-controller-manager.kubeconfig" \
  --bind-address="${HOST}" \
  --secure-port="${CONTROLLER_MANAGER_PORT}" \
  --tls-cert-file="${CERTS}/components-serving.crt" \
  --tls-private-key-file="${CERTS}/components-serving.key" \
  --client-ca-file="${CA}" \
  --use-service-account-credentials=true \
  --service-account-private-key-file="${CERTS}/sa.key" \
  --root-ca-file="${CA}" \
  --cluster-signing-cert-file="${CA}" \
  --cluster-signing-key-file="${CERTS}/ca.key" \
  --controllers="${KCM_CONTROLLERS}" \
  "${KCM_EXTRA[@]}" \
  --leader-elect=false \
  --kube-api-qps=100 --kube-api-burst=200 \
  --profiling=false

start_component kube-scheduler "${SCHEDULER_PORT}" "${CONF}/kube-scheduler.yaml" "${BIN_DIR}/kube-scheduler" \
  --config="${CONF}/kube-scheduler.yaml" \
  --authentication-kubeconfig="${KCFG}/kube-scheduler.kubeconfig" \
  --authorization-kubeconfig="${KCFG}/kube-scheduler.kubeconfig" \
  --bind-address="${HOST}" \
  --secure-port="${SCHEDULER_PORT}" \
  --tls-cert-file="${CERTS}/components-serving.crt" \
  --tls-private-key-file="${CERTS}/components-serving.key" \
  --client-ca-file="${CA}" \
  --profiling=false

KWOK_CONFIGS=("${KWOK_STAGES}")
if [[ "${QOS_KWOK_USAGE:-1}" == 1 ]]; then KWOK_CONFIGS+=("${HACK_DIR}/kwok-usage.yaml"); fi
{ cat "${KWOK_CONFIGS[@]}"; echo "node-lease-duration-seconds=${QOS_KWOK_NODE_LEASE_SECONDS}"; } > "${CONF}/kwok.fingerprint"
start_component kwok "${KWOK_PORT}" "${CONF}/kwok.fingerprint" "${BIN_DIR}/kwok" \
  --kubeconfig="${KCFG}/kwok.kubeconfig" \
  "${KWOK_CONFIGS[@]/#/--config=}" \
  --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-lease-duration-seconds="${QOS_KWOK_NODE_LEASE_SECONDS}" \
  --server-address="${HOST}:${KWOK_PORT}" \
  --node-ip="${HOST}" \
  --cidr=10.244.0.0/16

# ---------------------------------------------------------------- the extender (real, optional)
EXTENDER_CURL=(--cacert "${CA}" --cert "${CERTS}/extender-metrics-client.crt" --key "${CERTS}/extender-metrics-client.key")
if [[ "${QOS_START_EXTENDER}" == 1 ]]; then
  [[ -x "${QOS_PYTHON}" ]] || die "missing ${QOS_PYTHON}: make venv (or set QOS_PYTHON)"
  [[ "${EXTENDER_HOST}" == 127.0.0.1 || "${EXTENDER_HOST}" == localhost ]] \
    || die "QOS_START_EXTENDER=1 serves on 127.0.0.1 only; EXTENDER_URL host is ${EXTENDER_HOST}"
  # Only what differs from the defaults (docs/settings/extender.yaml): this cluster's server, TLS and kubeconfig,
  # layered over QOS_EXTENDER_CONFIG when set; the fingerprint also covers the code, so an edited extender is
  # restarted by the next local-up.
  "${QOS_PYTHON}" - "${QOS_EXTENDER_CONFIG}" "${CONF}/extender.yaml" <<PY || die "cannot write ${CONF}/extender.yaml"
import sys, yaml
doc = (yaml.safe_load(open(sys.argv[1])) or {}) if sys.argv[1] else {}
doc.setdefault("server", {}).update(
    host="${HOST}", port=${EXTENDER_PORT},
    tls={"cert_file": "${CERTS}/extender-serving.crt", "key_file": "${CERTS}/extender-serving.key",
         "client_ca_file": "${CERTS}/ca.crt"},
)
doc["server"]["loopback_verbs_port"] = int("${QOS_EXTENDER_LOOPBACK_PORT}") if "${QOS_EXTENDER_LOOPBACK_PORT}" else None
doc.setdefault("kubernetes", {})["kubeconfig"] = "${KCFG}/qos-extender.kubeconfig"
doc.setdefault("scheduling", {})["marker_resource"] = "${QOS_MARKER_RESOURCE}"
ctl = doc.setdefault("controller", {})
ctl["enabled"] = "${QOS_WITH_CONTROLLER}" == "1"
# hack/manifests grants the local controller Leases in kube-system only, whatever the layered-over file says
ctl.setdefault("leader_election", {})["lease_namespace"] = "kube-system"
yaml.safe_dump(doc, open(sys.argv[2], "w"), sort_keys=False)
PY
  { cat "${CONF}/extender.yaml"
    find "${REPO_ROOT}/extender" -name '*.py' -print0 | sort -z | xargs -0 cat
  } > "${CONF}/extender.fingerprint"
  start_component qos-extender "${EXTENDER_PORT}" "${CONF}/extender.fingerprint" "${QOS_PYTHON}" \
    -m extender.cli serve --config "${CONF}/extender.yaml"
fi

wait_for kube-controller-manager 60 curl_ok "https://${HOST}:${CONTROLLER_MANAGER_PORT}/healthz" --cacert "${CA}"
wait_for kube-scheduler 60 curl_ok "https://${HOST}:${SCHEDULER_PORT}/healthz" --cacert "${CA}"
wait_for kwok 60 curl_ok "http://${HOST}:${KWOK_PORT}/healthz"
wait_for prometheus 60 curl -sfS --max-time 2 "http://${HOST}:${PROMETHEUS_PORT}/-/ready"
if [[ "${QOS_START_EXTENDER}" == 1 ]]; then
  # /readyz answers 200 only once nodes and pods were listed (the scheduler's calls get 503 before).
  wait_for qos-extender 60 curl -sf --max-time 2 "${EXTENDER_CURL[@]}" "${EXTENDER_URL}/readyz"
  log "qos-extender: ready ($((SECONDS - T0))s)"
fi
# Pods fail with 'serviceaccount "default" not found' until the controller-manager created it.
wait_for kube-controller-manager 60 "${KUBECTL[@]}" get serviceaccount default -n default

# ---------------------------------------------------------------- kwok nodes
node_manifest() { # <name> <group> <flavour>
  local name="$1" group="$2" flavour="$3"
  cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: ${name}
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
    qos.kube-qos-extender.io/price-per-hour: "${FL_PRICE[${flavour}]}"
  labels:
    type: kwok
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: ${name}
    node.kubernetes.io/instance-type: ${flavour}
    qos.kube-qos-extender.io/node-group: ${group}
spec: {}
status:
  allocatable: {cpu: "${FL_CPU[${flavour}]}", memory: "${FL_MEM[${flavour}]}", pods: "${FL_PODS[${flavour}]}"}
  capacity: {cpu: "${FL_CPU[${flavour}]}", memory: "${FL_MEM[${flavour}]}", pods: "${FL_PODS[${flavour}]}"}
  nodeInfo:
    architecture: amd64
    operatingSystem: linux
    kubeletVersion: ${KUBE_VERSION}
    kubeProxyVersion: ${KUBE_VERSION}
    containerRuntimeVersion: kwok-${KWOK_VERSION}
  phase: Running
EOF
}

CREATED=()
for spec in "${NODE_SPECS[@]}"; do
  read -r group flavour count <<< "${spec}"
  prefix="${group}-${flavour//./-}"
  sel="qos.kube-qos-extender.io/node-group=${group},node.kubernetes.io/instance-type=${flavour},type=kwok"
  mapfile -t existing < <("${KUBECTL[@]}" get nodes -l "${sel}" -o name | sed 's|^node/||')
  declare -A have=()
  for n in "${existing[@]}"; do have[${n}]=1; done
  manifest=""
  for ((i = 0; i < count; i++)); do
    name="${prefix}-${i}"
    CREATED+=("${name}")
    # (not `printf | grep -q`: with pipefail, grep exiting early makes printf's SIGPIPE fail the test)
    if [[ -n "${have[${name}]:-}" ]]; then continue; fi
    manifest+="$(node_manifest "${name}" "${group}" "${flavour}")"$'\n---\n'
  done
  if [[ -n "${manifest}" ]]; then
    "${KUBECTL[@]}" create -f - <<< "${manifest}" >&2
  fi
  for n in "${existing[@]}"; do
    idx="${n##*-}"
    if [[ "${n}" == "${prefix}-${idx}" && "${idx}" =~ ^[0-9]+$ ]] && ((idx >= count)); then
      "${KUBECTL[@]}" delete node "${n}" --wait=false >&2
    fi
  done
done
if ((${#CREATED[@]} > 500)); then
  # kubectl wait checks the named nodes one at a time (~3 a second on a loaded machine: ~25 min at 5,000 nodes,
  # the "slow kwok" of earlier scale runs): list them all at once instead, until every created node is Ready
  # and the node lifecycle controller has lifted the not-ready taint nodes are admitted with (~30 nodes/s at
  # its 100 QPS: a bench started before that finds most nodes unschedulable).
  deadline=$((SECONDS + 60 + ${#CREATED[@]} / 2))
  jp='{range .items[*]}{.metadata.name}{" "}{.status.conditions[?(@.type=="Ready")].status}{" "}{.spec.taints[*].key}{"\n"}{end}'
  while :; do
    missing=$(comm -23 <(printf '%s\n' "${CREATED[@]}" | sort) <("${KUBECTL[@]}" get nodes -l type=kwok -o jsonpath="${jp}" \
      2>/dev/null | awk '$2 == "True" && !/node\.kubernetes\.io\/not-ready/ {print $1}' | sort) | wc -l)
    ((missing == 0)) && break
    ((SECONDS < deadline)) || die "${missing} kwok nodes did not become Ready; see ${LOGS}/kwok.log"
    sleep 2
  done
elif ((${#CREATED[@]})); then
  # kwok makes ~10-50 nodes Ready per second here (less on a loaded machine): scale the wait with the count.
  "${KUBECTL[@]}" wait --for=condition=Ready --timeout="$((60 + ${#CREATED[@]} / 2))s" "${CREATED[@]/#/node/}" >&2 \
    || die "kwok nodes did not become Ready; see ${LOGS}/kwok.log"
fi
log "nodes: $("${KUBECTL[@]}" get nodes -l type=kwok --no-headers 2>/dev/null | wc -l) kwok node(s)"

# ---------------------------------------------------------------- real nodes
if ((${#REAL_SPECS[@]})); then
  QOS_STATE="${QOS_STATE}" QOS_BIN_DIR="${BIN_DIR}" QOS_APISERVER_PORT="${APISERVER_PORT}" \
    "${HACK_DIR}/real-nodes.sh" up "${REAL_SPECS[@]}"
fi

# ---------------------------------------------------------------- result
{
  echo "KUBECONFIG=${ADMIN_KUBECONFIG}"
  echo "EXTENDER_URL=${EXTENDER_URL}"
  echo "EXTENDER_METRICS_URL=${EXTENDER_METRICS_URL}"
  echo "EXTENDER_CA=${CERTS}/ca.crt"
  # the scraper's identity (/metrics only), as hack/kind-up.sh and hack/deploy-local.sh print it
  echo "EXTENDER_CLIENT_CERT=${CERTS}/extender-metrics-client.crt"
  echo "EXTENDER_CLIENT_KEY=${CERTS}/extender-metrics-client.key"
  # kube-scheduler's identity (the verbs only)
  echo "EXTENDER_SCHEDULER_CERT=${CERTS}/extender-client.crt"
  echo "EXTENDER_SCHEDULER_KEY=${CERTS}/extender-client.key"
  echo "EXTENDER_SERVING_CERT=${CERTS}/extender-serving.crt"
  echo "EXTENDER_SERVING_KEY=${CERTS}/extender-serving.key"
  echo "PROMETHEUS_URL=http://${HOST}:${PROMETHEUS_PORT}"
  echo "QOS_STATE=${QOS_STATE}"
  echo "QOS_BIN_DIR=${BIN_DIR}"
  echo "QOS_WITH_EXTENDER=${QOS_WITH_EXTENDER}"
  echo "QOS_START_EXTENDER=${QOS_START_EXTENDER}"
  echo "QOS_WITH_CONTROLLER=${QOS_WITH_CONTROLLER}"
  echo "QOS_MARKER_RESOURCE=${QOS_EXTENDER_MANAGED_RESOURCE}"
  echo "QOS_SCHEDULER_URL=https://${HOST}:${SCHEDULER_PORT}"
} > "${QOS_STATE}/env"
log "control plane up in $((SECONDS - T0))s (state ${QOS_STATE}; logs ${LOGS}; stop with hack/local-down.sh)"
cat "${QOS_STATE}/env"
