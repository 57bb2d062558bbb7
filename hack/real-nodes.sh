#!/usr/bin/env bash
# Real (kubelet) nodes for the local control plane of hack/local-up.sh: each a kubelet, its own containerd
# (own root, state, socket, cgroup root, pod CIDR, CNI config) and a kube-proxy, inside a network namespace
# this script creates, with a non-loopback node address there. Called by local-up.sh / local-down.sh.
#
# Usage: hack/real-nodes.sh up [GROUP:]FLAVOUR=COUNT ...    (needs the apiserver of $QOS_STATE running)
#        hack/real-nodes.sh down                             (removes every real node of $QOS_STATE)
#        hack/real-nodes.sh import IMAGE.tar ...             (imports images into every real node's containerd)
#        hack/real-nodes.sh list                             (NAME IP POD_CIDR lines)
#        hack/real-nodes.sh remove NAME ...                  (a machine going away: its Node object deleted,
#                                                             the node stopped and forgotten; what a cloud does
#                                                             after the autoscaler deleted the instance)
#        hack/real-nodes.sh restart-kubelet NAME ...         (its kubelet stopped and started again: a Node
#                                                             object deleted from the API registers again)
#        hack/real-nodes.sh restart-containerd NAME ...      (its containerd restarted with the config written
#                                                             anew; running containers stay with their shims;
#                                                             on a CRI-O node: its crio, as restart-runtime)
#        hack/real-nodes.sh restart-runtime NAME ...         (the node's runtime, containerd or crio, restarted so)
#
# QOS_NODE_RUNTIME (default containerd): the container runtime of the nodes `up` creates, containerd or crio
# (CRI-O, hack/build-crio.sh; the same runc, CRIU, CNI plugins and kubelet). Recorded per node
# (/var/lib/qos-local-nodes/<node>/runtime): later commands act on each node's own runtime, so a cluster may mix
# them (`up` again with the other value adds nodes of a new group/flavour with it; existing nodes keep theirs).
# QOS_NODE_RESTORE_VIA_CREATE (default true): containerd's enable_experimental_restore_via_create on the nodes
# written by up / restart-*: false makes a runtime that cannot restore a checkpoint (e2e: the clean refusal).
# containerd only: CRI-O restores through CreateContainer whenever enable_criu_support is on (checkpoints need it).
# QOS_NODE_CRIU_SUPPORT (default true): CRI-O's enable_criu_support on the CRI-O nodes written by up / restart-*:
# false makes a CRI-O that can neither checkpoint nor restore (e2e: the probe's clean refusal).
#        hack/real-nodes.sh leftovers                        (exit 1, naming them, if anything of real nodes remains:
#                                                             namespaces, links, cgroups, mounts, processes, dirs)
#
# Topology (all addresses inside 10.250.0.0/16 and 10.245.0.0/16; nothing listens on a host address):
#   bridge qosbr0 (host side 10.250.0.1/24, no listener) --veth-- netns qos-apigw 10.250.0.2: netns_relay.py
#     listening on 10.250.0.2:6443, relaying to the apiserver on the host's 127.0.0.1 (kubelets, kube-proxy
#     and pods use it; the `kubernetes` Service's endpoint points there)
#                                                   --veth-- netns qos-<node> 10.250.0.(10+i): containerd,
#     kubelet (:10250 on the node address), kube-proxy (iptables inside the namespace), CNI bridge cni0 with
#     pods in 10.245.i.0/24. Every namespace (and the host) routes each pod CIDR via its node's address, so
#     pods on different nodes reach each other and the apiserver reaches webhooks served by pods.
#   cgroups: /qos-<node> in every v1 hierarchy (kubelet cgroupRoot, cgroupfs driver).
#   files: /var/lib/qos-local-nodes/<node>/{kubelet,containerd,cni}, /run/qos-local-nodes/<node>/ (sockets,
#     state), logs in $QOS_STATE/logs/nodes/. One local cluster at a time owns real nodes
#     (/run/qos-local-nodes/owner).
#   CRI-O nodes: /var/lib/qos-local-nodes/<node>/{crio.conf,crio/} (config, policy.json, registries.conf),
#     containers/storage root /var/lib/qos-local-nodes/<node>/containers/storage, runroot
#     /run/qos-local-nodes/<node>/containers/storage (overlay), socket /run/qos-local-nodes/<node>/crio.sock
#     (CRI and CRI-O's HTTP info API: curl --unix-socket SOCK http://localhost/info), every other state path
#     (runc root, exits, attach sockets, pinned namespaces, version files) under /run/qos-local-nodes/<node>/.
#
# Node labels: node.kubernetes.io/instance-type=FLAVOUR, qos.kube-qos-extender.io/node-group=GROUP, type=real;
# annotation qos.kube-qos-extender.io/price-per-hour from config/flavours.yaml. Capacity is the machine's
# (a kubelet reports what it sees): the flavour is a label, not a size, on these nodes.
#
# Images: $QOS_NODE_IMAGES (default: pause.tar busybox.tar of $QOS_CACHE/images, made by hack/build-image.sh)
# are imported into each new node's containerd (namespace k8s.io); registry.k8s.io/pause:3.10 is required.
# Others (the product's image) with `hack/real-nodes.sh import TAR...`. On a CRI-O node every RepoTag of the
# docker-save tar is copied with skopeo into the node's containers/storage (names normalised as containerd
# does: qos-local/busybox:1.35.0 is docker.io/qos-local/busybox:1.35.0). Nothing is ever pulled: the namespaces
# have no route off the machine.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

QOS_STATE="${QOS_STATE:-/tmp/qos-local}"
NODES_ROOT=/var/lib/qos-local-nodes
RUN_ROOT=/run/qos-local-nodes
BRIDGE=qosbr0
BRIDGE_CIDR=10.250.0.1/24
APIGW_NS=qos-apigw
APIGW_IP=10.250.0.2
APISERVER_PORT="${QOS_APISERVER_PORT:-6443}"
POD_CIDR_ALL=10.245.0.0/16
SANDBOX_IMAGE=registry.k8s.io/pause:3.10
IMAGES_DIR="${QOS_CACHE}/images"
read -r -a NODE_IMAGES <<< "${QOS_NODE_IMAGES:-${IMAGES_DIR}/pause.tar ${IMAGES_DIR}/busybox.tar}"
CERTS="${QOS_STATE}/certs"
LOGS="${QOS_STATE}/logs/nodes"
REGISTRY="${QOS_STATE}/real-nodes"   # lines: name index group flavour
BIN_DIR="${QOS_BIN_DIR:-${BIN_DIR}}"
CRIU_DIR="${QOS_CACHE}/criu-${CRIU_VERSION}"
KUBECTL=("${BIN_DIR}/kubectl" --kubeconfig "${QOS_STATE}/kubeconfig/admin.kubeconfig")
NODE_RUNTIME="${QOS_NODE_RUNTIME:-containerd}"

cmd="${1:-}"
shift || true

ns_exec() { local ns="$1"; shift; nsenter --net="/run/netns/${ns}" -- "$@"; }
node_ip() { echo "10.250.0.$((10 + $1))"; }
node_cidr() { echo "10.245.$1.0/24"; }
cg_hierarchies() { find /sys/fs/cgroup -mindepth 1 -maxdepth 1 -type d ! -name unified; }
# the runtime a node was created with (nodes from before the choice existed: containerd)
node_runtime() { cat "${NODES_ROOT}/$1/runtime" 2>/dev/null || echo containerd; }
# containers/storage of a CRI-O node, as c/image's containers-storage transport names a store
crio_store() { echo "[overlay@${NODES_ROOT}/$1/containers/storage+${RUN_ROOT}/$1/containers/storage]"; }

alive() { # <pidfile> -> pid if alive and still ours (its command line holds the token start recorded)
  [[ -s "$1" ]] || return 1
  local pid token
  pid="$(cat "$1")"
  kill -0 "${pid}" 2>/dev/null || return 1
  token="$(cat "$1.match" 2>/dev/null || true)"
  if [[ -n "${token}" ]] && ! tr '\0' ' ' < "/proc/${pid}/cmdline" 2>/dev/null | grep -qF -- "${token}"; then
    return 1  # a reused pid: not ours
  fi
  echo "${pid}"
}

# start <pidfile> <log> <netns|-> cmd...: setsid, optionally inside the namespace (nsenter --net only: the
# kubelet and containerd must share the host's mount namespace, or secret/projected volumes the kubelet
# mounts would be invisible to runc; `ip netns exec` would give each its own).
start() {
  local pidfile="$1" logf="$2" ns="$3"
  shift 3
  if alive "${pidfile}" >/dev/null; then return 0; fi
  # the token alive() checks: the last argument, so every caller ends with one unique to this component (its
  # config path, or its address)
  printf '%s' "${*: -1}" > "${pidfile}.match"
  if [[ "${ns}" == - ]]; then
    setsid "$@" >> "${logf}" 2>&1 < /dev/null &
  else
    setsid nsenter --net="/run/netns/${ns}" -- "$@" >> "${logf}" 2>&1 < /dev/null &
  fi
  echo $! > "${pidfile}"
}

stop_pid() { # <pidfile>
  local pid
  pid="$(alive "$1")" || { rm -f "$1"; return 0; }
  kill "${pid}" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
  kill -9 "${pid}" 2>/dev/null || true
  rm -f "$1" "$1.match"
}

gen_node_cert() { # <file-base> <subject> <eku> [san]
  [[ -s "$1.crt" ]] && return 0
  sign_cert "${CERTS}/ca" "$@"
}

write_kubeconfig() { # <file> <cert base>
  kubeconfig "https://${APIGW_IP}:${APISERVER_PORT}" "${CERTS}/ca.crt" node "$2" | put "$1"
}

put() { # <file>: stdin into file only when the content changed (kube-proxy exits when its config is rewritten)
  local tmp="$1.tmp.$$"
  cat > "${tmp}"
  if cmp -s "${tmp}" "$1"; then rm -f "${tmp}"; else mv -f "${tmp}" "$1"; fi
}

# ---------------------------------------------------------------- network
ensure_fabric() {
  ip link show "${BRIDGE}" >/dev/null 2>&1 || ip link add "${BRIDGE}" type bridge
  ip addr replace "${BRIDGE_CIDR}" dev "${BRIDGE}"
  ip link set "${BRIDGE}" up
  # Nothing of the lab may leave the machine (the host forwards, and its default route leads off it): the lab's
  # ranges are unreachable on the host except for the routes to live nodes, so a pod IP Prometheus still
  # scrapes after its node went away gets "unreachable", not the host's default route.
  ip route replace unreachable "${POD_CIDR_ALL}"
  ip route replace unreachable 10.250.0.0/16
  ensure_netns "${APIGW_NS}" "${APIGW_IP}" qosv-apigw
  mkdir -p "${QOS_STATE}/pids"
  start "${QOS_STATE}/pids/apigw-relay.pid" "${QOS_STATE}/logs/apigw-relay.log" - \
    python3 "${HACK_DIR}/netns_relay.py" --netns "${APIGW_NS}" --connect "127.0.0.1:${APISERVER_PORT}" \
    --listen "${APIGW_IP}:${APISERVER_PORT}"
  local t=$((SECONDS + 15))
  until [[ -n "$(nsenter --net="/run/netns/${APIGW_NS}" ss -Hltn "sport = :${APISERVER_PORT}" 2>/dev/null)" ]]; do
    # (kill -0, not alive(): right after the fork the child may not have exec'd python yet, so its command
    # line does not hold the token; seen in CI as a false "exited")
    kill -0 "$(cat "${QOS_STATE}/pids/apigw-relay.pid")" 2>/dev/null \
      || die "the apiserver relay exited; see ${QOS_STATE}/logs/apigw-relay.log"
    ((SECONDS < t)) || die "the apiserver relay is not listening on ${APIGW_IP}:${APISERVER_PORT}"
    sleep 0.1
  done
  # Prometheus targets for config/'s extender pods (hack/local-up.sh's job kube-qos-extender-in-cluster)
  start "${QOS_STATE}/pids/prom-pod-sd.pid" "${QOS_STATE}/logs/prom-pod-sd.log" - \
    python3 "${HACK_DIR}/prom_pod_sd.py" --kubectl "${BIN_DIR}/kubectl" \
    --kubeconfig "${QOS_STATE}/kubeconfig/admin.kubeconfig" --namespace kube-qos-system \
    --selector app.kubernetes.io/name=qos-scheduler --port-name https \
    --out "${QOS_STATE}/config/in-cluster-extender-targets.json"
  # The `kubernetes` Service (ClusterIP 10.96.0.1, what in-cluster clients use) ends at the relay: the
  # apiserver runs with --endpoint-reconciler-type=none, so its endpoints are ours to write.
  "${KUBECTL[@]}" apply --server-side --force-conflicts --field-manager=qos-real-nodes -f - >/dev/null <<EOF
apiVersion: v1
kind: Endpoints
metadata:
  name: kubernetes
  namespace: default
  labels: {endpointslice.kubernetes.io/skip-mirror: "true"}
subsets:
- addresses: [{ip: ${APIGW_IP}}]
  ports: [{name: https, port: ${APISERVER_PORT}, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: qos-real-nodes}
addressType: IPv4
endpoints:
- addresses: [${APIGW_IP}]
  conditions: {ready: true}
ports:
- {name: https, port: ${APISERVER_PORT}, protocol: TCP}
EOF
}

ensure_netns() { # <ns> <ip> <host-side veth name>
  local ns="$1" ip="$2" veth="$3"
  [[ -e "/run/netns/${ns}" ]] || ip netns add "${ns}"
  ip link show "${veth}" >/dev/null 2>&1 || ip link add "${veth}" type veth peer name eth0 netns "${ns}"
  ip link set "${veth}" master "${BRIDGE}" up
  ip -n "${ns}" link set lo up
  ip -n "${ns}" link set eth0 up
  ip -n "${ns}" addr replace "${ip}/24" dev eth0
  # No default route via the host: the host forwards, and its default route leaves the machine. A namespace
  # reaches the bridge (10.250.0.0/24), the pod CIDRs (sync_routes) and Service IPs (DNATed by kube-proxy to
  # one of those); anything else is unreachable (an image pull, a stray DNS query).
  ip -n "${ns}" route del default 2>/dev/null || true
  ip -n "${ns}" route replace unreachable default
  ip -n "${ns}" route replace 10.96.0.0/16 dev eth0
  ns_exec "${ns}" sysctl -qw net.ipv4.ip_forward=1
}

# Every namespace and the host route each node's pod CIDR via that node's address (host-gw style).
sync_routes() {
  local name idx _g _f ns
  local all=("${APIGW_NS}")
  while read -r name idx _g _f; do all+=("qos-${name}"); done < "${REGISTRY}"
  while read -r name idx _g _f; do
    ip route replace "$(node_cidr "${idx}")" via "$(node_ip "${idx}")" dev "${BRIDGE}"
    for ns in "${all[@]}"; do
      [[ "${ns}" == "qos-${name}" ]] && continue
      ip -n "${ns}" route replace "$(node_cidr "${idx}")" via "$(node_ip "${idx}")" dev eth0
    done
  done < "${REGISTRY}"
}

# ---------------------------------------------------------------- one node
ensure_cgroup_root() { # <name>
  local h
  while read -r h; do
    mkdir -p "${h}/$1"
    if [[ -f "${h}/cpuset.cpus" ]]; then
      [[ -s "${h}/$1/cpuset.cpus" ]] && [[ -n "$(tr -d '\n' < "${h}/$1/cpuset.cpus")" ]] \
        || cat "${h}/cpuset.cpus" > "${h}/$1/cpuset.cpus"
      [[ -n "$(tr -d '\n' < "${h}/$1/cpuset.mems")" ]] || cat "${h}/cpuset.mems" > "${h}/$1/cpuset.mems"
    fi
  done < <(cg_hierarchies)
}

write_node_configs() { # <name> <idx> <group> <flavour>
  local name="$1" idx="$2" group="$3" flavour="$4"
  local dir="${NODES_ROOT}/${name}" run="${RUN_ROOT}/${name}" ip cidr runtime endpoint
  ip="$(node_ip "${idx}")" cidr="$(node_cidr "${idx}")" runtime="$(node_runtime "${name}")"
  mkdir -p "${dir}/kubelet" "${dir}/cni/net.d" "${dir}/cni/ipam" "${dir}/pki" "${dir}/logs" "${run}"
  chmod 700 "${dir}/pki"
  gen_node_cert "${dir}/pki/kubelet-client" "/O=system:nodes/CN=system:node:${name}" clientAuth
  gen_node_cert "${dir}/pki/kubelet-serving" "/O=system:nodes/CN=system:node:${name}" serverAuth \
    "IP:${ip},DNS:${name}"
  gen_node_cert "${dir}/pki/kube-proxy" "/CN=system:kube-proxy" clientAuth
  write_kubeconfig "${dir}/kubelet.kubeconfig" "${dir}/pki/kubelet-client"
  write_kubeconfig "${dir}/kube-proxy.kubeconfig" "${dir}/pki/kube-proxy"

  if [[ "${runtime}" == crio ]]; then
    write_crio_config "${name}"
    endpoint="unix://${run}/crio.sock"
  else
    mkdir -p "${dir}/containerd"
    endpoint="unix://${run}/containerd.sock"
  put "${dir}/containerd.toml" <<EOF
version = 3
root = "${dir}/containerd"
state = "${run}/containerd"
[grpc]
  address = "${run}/containerd.sock"
[ttrpc]
  address = "${run}/containerd.sock.ttrpc"
[plugins.'io.containerd.cri.v1.runtime']
  # root lacks CAP_SYS_RESOURCE on these machines: runc cannot lower oom_score_adj (the pause container asks -998)
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  # kubelet checkpoint archives as images: restore through CreateContainer (issue 13)
  enable_experimental_restore_via_create = ${QOS_NODE_RESTORE_VIA_CREATE:-true}
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "${BIN_DIR}/runc"
        # runc's state under the node's run dir (the default /run/containerd/runc is shared by every containerd)
        Root = "${run}/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "${dir}/cni/net.d"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "${SANDBOX_IMAGE}"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
  fi

  # The network's name is the node's own: libcni caches every attachment under /var/lib/cni/results/<network>-...
  # (host-wide: no runtime here sets another cache dir), and CRI-O garbage-collects at start every cached
  # attachment of its networks that is not one of its pods (CNI DEL): with one name for all, restarting one
  # node's crio tore down the other nodes' pod interfaces.
  put "${dir}/cni/net.d/10-qos-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "qos-pods-${idx}",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "${dir}/cni/ipam",
              "ranges": [[{"subnet": "${cidr}"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

  put "${dir}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ${ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${CERTS}/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: ${dir}/pki/kubelet-serving.crt
tlsPrivateKeyFile: ${dir}/pki/kubelet-serving.key
containerRuntimeEndpoint: ${endpoint}
cgroupDriver: cgroupfs
cgroupRoot: /qos-${name}
# cgroup v1 on these machines (kubelet 1.35 refuses v1 unless told)
failCgroupV1: false
failSwapOn: false
podCIDR: ${cidr}
podLogsDir: ${dir}/logs
clusterDomain: cluster.local
resolvConf: ""
serializeImagePulls: false
# images come from local tars only (no registry): never garbage-collect them
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "2%", imagefs.available: "2%"}
maxPods: 110
featureGates: {ContainerCheckpoint: true}
EOF

  put "${dir}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: ${dir}/kube-proxy.kubeconfig}
hostnameOverride: ${name}
bindAddress: ${ip}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
mode: iptables
clusterCIDR: ${POD_CIDR_ALL}
# inside a network namespace: leave the host-wide conntrack sysctls alone
conntrack: {maxPerCore: 0, min: 0}
EOF
  echo "${group} ${flavour}" > "${dir}/spec"
}

# CRI-O's configuration of a node: everything it would keep in a host-wide place (/var/run/crio, /var/lib/crio,
# /var/lib/containers, /etc/containers, /var/run/nri, /var/run/netns) is the node's own, so several CRI-O nodes
# (and the containerd ones) coexist on one host. Read by `crio --config FILE --config-dir DIR` (an empty dir:
# /etc/crio/crio.conf.d is not read).
write_crio_config() { # <name>
  local name="$1" dir="${NODES_ROOT}/$1" run="${RUN_ROOT}/$1"
  mkdir -p "${dir}/crio/conf.d" "${dir}/crio/registries.conf.d" "${dir}/crio/policies" "${dir}/crio/keys" "${dir}/crio/cdi" "${dir}/crio/hooks.d" \
    "${dir}/containers/storage" "${run}/containers/storage" "${run}/exits" "${run}/attach" "${run}/ns"
  # runc through a wrapper for two quirks of these machines (hack/runc_host_quirks.py): root lacks
  # CAP_SYS_RESOURCE, so runc cannot lower oom_score_adj (the pause container asks -998, Guaranteed containers
  # -997) and CRI-O has no restrict_oom_score_adj: the request is clamped to the caller's own value as
  # containerd's option does; hugetlb is not a v1 hierarchy here: the kubelet's hugepage limits are dropped
  put "${dir}/crio/runc" <<EOF
#!/bin/sh
exec /usr/bin/python3 ${HACK_DIR}/runc_host_quirks.py ${BIN_DIR}/runc "\$@"
EOF
  chmod 755 "${dir}/crio/runc"
  # images come from local tars only: skopeo (import) accepts them unsigned, never consults /etc/containers
  put "${dir}/crio/policy.json" <<'EOF'
{"default": [{"type": "insecureAcceptAnything"}]}
EOF
  # short names (qos-local/busybox:1.35.0, as pods name them) resolve to docker.io/..., as containerd and
  # skopeo normalise them; crio's (hidden) --registries-conf{,-dir} flags: not /etc/containers/registries.conf{,.d}
  put "${dir}/crio/registries.conf" <<'EOF'
unqualified-search-registries = ["docker.io"]
short-name-mode = "permissive"
EOF
  # what skopeo (import) and crio read instead of /etc/containers/storage.conf
  put "${dir}/crio/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "${dir}/containers/storage"
runroot = "${run}/containers/storage"
EOF
  put "${dir}/crio.conf" <<EOF
[crio]
root = "${dir}/containers/storage"
runroot = "${run}/containers/storage"
storage_driver = "overlay"
storage_option = []
log_dir = "${dir}/crio/pods"
version_file = "${run}/crio-version"
version_file_persist = "${dir}/crio/version"
clean_shutdown_file = "${dir}/crio/clean.shutdown"

[crio.api]
listen = "${run}/crio.sock"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
# kubelet checkpoints (CRIU >= 4.1 first on crio's and conmon's PATH) and restore through CreateContainer
enable_criu_support = ${QOS_NODE_CRIU_SUPPORT:-true}
pinns_path = "${BIN_DIR}/pinns"
namespaces_dir = "${run}/ns"
container_exits_dir = "${run}/exits"
container_attach_socket_dir = "${run}/attach"
hooks_dir = ["${dir}/crio/hooks.d"]
cdi_spec_dirs = ["${dir}/crio/cdi"]
decryption_keys_path = "${dir}/crio/keys"
irqbalance_config_restore_file = "disable"
log_level = "info"

[crio.runtime.runtimes.runc]
runtime_path = "${dir}/crio/runc"
runtime_type = "oci"
# runc's state under the node's run dir (the default /run/runc is shared by every runc of the host)
runtime_root = "${run}/runc"
monitor_path = "$(command -v conmon || echo /usr/bin/conmon)"
# with cgroupfs: conmon in the pod's cgroup, under the node's cgroup root (teardown kills it with the pod)
monitor_cgroup = "pod"
monitor_env = ["PATH=${BIN_DIR}:${CRIU_DIR}:/usr/sbin:/usr/bin:/sbin:/bin"]

[crio.image]
pause_image = "${SANDBOX_IMAGE}"
pinned_images = ["${SANDBOX_IMAGE}"]
# no signature_policy: CRI-O 1.34 refuses every restore when one is set ("namespaced signature policy ...
# signature validation is not supported for container restore", server/container_restore.go); nothing is pulled
# here (no route off the machine), and the node's policy.json is skopeo's (import)
signature_policy_dir = "${dir}/crio/policies"

[crio.network]
network_dir = "${dir}/cni/net.d"
plugin_dirs = ["/usr/lib/cni"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
EOF
}

crio_info() { # <name>: CRI-O's HTTP info API on its socket answers
  curl -fsS --max-time 2 --unix-socket "${RUN_ROOT}/$1/crio.sock" http://localhost/info >/dev/null 2>&1
}

# CRI-O gives a hostPath mount that contains its storage root HostToContainer propagation (it must see the store's
# mounts) and then refuses to create the container unless that path is on a shared or slave mount
# (server/container_create_linux.go). On a systemd host "/" is shared; on these machines it is private, so
# ${NODES_ROOT} (which holds every CRI-O node's store, and which config/local-crio mounts into the agent) is made a
# shared bind mount of itself while CRI-O nodes exist; `down` unmounts it.
ensure_shared_nodes_root() {
  mkdir -p "${NODES_ROOT}"
  if [[ "$(findmnt -n -o TARGET --target "${NODES_ROOT}")" != "${NODES_ROOT}" ]]; then
    # only while nothing is mounted below it: a bind over live mounts (pods' volumes, container roots) would
    # hide them from everything that already holds their paths
    if awk -v a="${NODES_ROOT}/" 'index($2, a) == 1 {found = 1} END {exit !found}' /proc/self/mounts; then
      die "a CRI-O node needs ${NODES_ROOT} on a shared mount, and nodes already run below it unshared: run \
hack/real-nodes.sh down first, then up the CRI-O nodes (before or with the others)"
    fi
    mount --bind "${NODES_ROOT}" "${NODES_ROOT}"
  fi
  [[ "$(findmnt -n -o PROPAGATION --target "${NODES_ROOT}")" == shared ]] || mount --make-rshared "${NODES_ROOT}"
}

start_node() { # <name> <idx> <group> <flavour>
  local name="$1" idx="$2" group="$3" flavour="$4"
  local dir="${NODES_ROOT}/${name}" run="${RUN_ROOT}/${name}" ns="qos-${name}"
  local price
  ensure_netns "${ns}" "$(node_ip "${idx}")" "qosv-${idx}"
  ensure_cgroup_root "qos-${name}"
  write_node_configs "$@"
  mkdir -p "${LOGS}"
  local t=$((SECONDS + 30))
  if [[ "$(node_runtime "${name}")" == crio ]]; then
    ensure_shared_nodes_root
    # crio (and through monitor_env conmon and runc restore) finds CRIU >= 4.1 first on its PATH
    start "${run}/crio.pid" "${LOGS}/${name}-crio.log" "${ns}" \
      env PATH="${BIN_DIR}:${CRIU_DIR}:/usr/sbin:/usr/bin:/sbin:/bin" \
      CONTAINERS_STORAGE_CONF="${dir}/crio/storage.conf" "${BIN_DIR}/crio" \
      --registries-conf "${dir}/crio/registries.conf" --registries-conf-dir "${dir}/crio/registries.conf.d" \
      --config-dir "${dir}/crio/conf.d" --config "${dir}/crio.conf"
    until crio_info "${name}"; do
      kill -0 "$(cat "${run}/crio.pid")" 2>/dev/null || die "${name}: crio exited; see ${LOGS}/${name}-crio.log"
      ((SECONDS < t)) || die "${name}: crio not answering; see ${LOGS}/${name}-crio.log"
      sleep 0.2
    done
    import_images "${name}" "${NODE_IMAGES[@]}"
    skopeo inspect --raw "containers-storage:$(crio_store "${name}")${SANDBOX_IMAGE}" >/dev/null 2>&1 \
      || die "${name}: ${SANDBOX_IMAGE} missing in CRI-O's storage (run hack/build-image.sh: it makes ${IMAGES_DIR}/pause.tar)"
  else
    # containerd finds the shim and (for checkpoints) CRIU >= 4.1 on its PATH
    start "${run}/containerd.pid" "${LOGS}/${name}-containerd.log" "${ns}" \
      env PATH="${BIN_DIR}:${CRIU_DIR}:/usr/sbin:/usr/bin:/sbin:/bin" \
      "${BIN_DIR}/containerd" --config "${dir}/containerd.toml"
    until "${BIN_DIR}/ctr" --address "${run}/containerd.sock" version >/dev/null 2>&1; do
      ((SECONDS < t)) || die "${name}: containerd not answering; see ${LOGS}/${name}-containerd.log"
      sleep 0.2
    done
    import_images "${name}" "${NODE_IMAGES[@]}"
    # (not `ctr | grep -q`: grep exiting at the first match makes ctr's SIGPIPE fail the pipeline under pipefail)
    local images
    images="$("${BIN_DIR}/ctr" --address "${run}/containerd.sock" -n k8s.io images ls -q 2>/dev/null)"
    [[ $'\n'"${images}"$'\n' == *$'\n'"${SANDBOX_IMAGE}"$'\n'* ]] \
      || die "${name}: ${SANDBOX_IMAGE} missing in containerd (run hack/build-image.sh: it makes ${IMAGES_DIR}/pause.tar)"
  fi
  start "${run}/kubelet.pid" "${LOGS}/${name}-kubelet.log" "${ns}" \
    env PATH="${BIN_DIR}:/usr/sbin:/usr/bin:/sbin:/bin" \
    "${BIN_DIR}/kubelet" --v=1 --kubeconfig "${dir}/kubelet.kubeconfig" \
    --root-dir "${dir}/kubelet" --hostname-override "${name}" --node-ip "$(node_ip "${idx}")" \
    --node-labels "type=real,node.kubernetes.io/instance-type=${flavour},qos.kube-qos-extender.io/node-group=${group}" \
    --config "${dir}/kubelet.yaml"
  start "${run}/kube-proxy.pid" "${LOGS}/${name}-kube-proxy.log" "${ns}" \
    env PATH="${BIN_DIR}:/usr/sbin:/usr/bin:/sbin:/bin" \
    "${BIN_DIR}/kube-proxy" --v=1 --config "${dir}/kube-proxy.yaml"
  price="$(flavour_price "${flavour}")"
  echo "${price}" > "${dir}/price"
}

flavour_price() {
  python3 - "${REPO_ROOT}/config/flavours.yaml" "$1" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1])) or {}
doc = doc.get("flavours", doc) if isinstance(doc, dict) else doc
items = doc.items() if isinstance(doc, dict) else [(d.get("name"), d) for d in doc]
for name, d in items:
    if name == sys.argv[2]:
        print(d.get("price", d.get("price_per_hour", d.get("pricePerHour", 0))))
        break
else:
    print(0)
PY
}

import_stamp() { # <node> <tar>: the file recording that tar's import (size and mtime) into the node
  if [[ "$(node_runtime "$1")" == crio ]]; then
    echo "${NODES_ROOT}/$1/containers/.imported-$(basename "$2")"
  else
    echo "${NODES_ROOT}/$1/containerd/.imported-$(basename "$2")"
  fi
}

import_images() { # <node> tar...
  local name="$1" tar
  shift
  for tar in "$@"; do
    [[ -f "${tar}" ]] || continue
    local stamp sum
    stamp="$(import_stamp "${name}" "${tar}")"
    sum="$(stat -c '%s %Y' "${tar}")"
    [[ "$(cat "${stamp}" 2>/dev/null)" == "${sum}" ]] && continue
    if [[ "$(node_runtime "${name}")" == crio ]]; then
      import_crio "${name}" "${tar}" || die "${name}: cannot import ${tar}"
    else
      "${BIN_DIR}/ctr" --address "${RUN_ROOT}/${name}/containerd.sock" -n k8s.io images import "${tar}" >/dev/null || die "${name}: cannot import ${tar}"
    fi
    echo "${sum}" > "${stamp}"
    log "${name}: imported $(basename "${tar}")"
  done
}

# A docker-save tar into a CRI-O node's containers/storage (CRI has no image import): skopeo, once per RepoTag
# of its manifest.json, while crio runs (containers/storage locks the store; crio sees the new image at once).
import_crio() { # <node> <tar>
  local name="$1" tar="$2" tag tags
  tags="$(tar -xOf "${tar}" manifest.json | python3 -c 'import json, sys
for m in json.load(sys.stdin):
    for t in m.get("RepoTags") or []:
        print(t)')" || return 1
  [[ -n "${tags}" ]] || { log "${name}: ${tar} names no image (no RepoTags)"; return 1; }
  # skopeo run as root keeps a blob-info cache in /var/lib/containers/cache, whatever the store (no option moves
  # it): when that directory is new, it goes again
  local fresh=0 rc=0
  [[ -e /var/lib/containers ]] || fresh=1
  while read -r tag; do
    CONTAINERS_STORAGE_CONF="${NODES_ROOT}/${name}/crio/storage.conf" \
      skopeo --policy "${NODES_ROOT}/${name}/crio/policy.json" copy -q \
      "docker-archive:${tar}:${tag}" "containers-storage:$(crio_store "${name}")${tag}" >&2 || { rc=1; break; }
  done <<< "${tags}"
  if ((fresh)); then
    rm -f /var/lib/containers/cache/blob-info-cache-v1.boltdb
    rmdir /var/lib/containers/cache /var/lib/containers 2>/dev/null || true
  fi
  return "${rc}"
}

# ---------------------------------------------------------------- teardown of one node
kill_cgroup() { # <cgroup name>: every process under it, in every hierarchy
  local h pids
  for _ in 1 2 3; do
    pids="$(cg_hierarchies | while read -r h; do
      # (an `if`, not `[[ ]] &&`: a missing dir would end the loop with status 1 and, under pipefail and
      # errexit, the whole teardown; seen when a node failed before its cgroups were made)
      if [[ -d "${h}/$1" ]]; then find "${h}/$1" -name cgroup.procs -exec cat {} + 2>/dev/null || true; fi
    done | sort -u)"
    [[ -z "${pids}" ]] && break
    # shellcheck disable=SC2086
    kill -9 ${pids} 2>/dev/null || true
    sleep 0.3
  done
}

remove_cgroup() { # <cgroup name>: deepest first
  local h
  while read -r h; do
    [[ -d "${h}/$1" ]] || continue
    find "${h}/$1" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done < <(cg_hierarchies)
}

unmount_under() { # <dir>: every mount below it, deepest first
  local m
  while read -r m; do
    umount -l "${m}" 2>/dev/null || true
  done < <(awk -v d="$1" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r)
}

stop_node() { # <name> <idx>
  local name="$1" idx="$2" run="${RUN_ROOT}/$1" p
  for p in kube-proxy kubelet; do stop_pid "${run}/${p}.pid"; done
  # shims and containers belong to no pidfile: find them by the node's socket / cgroup (CRI-O's conmons run in
  # their pod's cgroup, under the node's; any outside it are found by their paths under the node's run dir)
  local shims
  shims="$(pgrep -f "containerd-shim-runc-v2.*${run}/containerd.sock" || true)"
  shims+=" $(pgrep -f "conmon .*${run}/" || true)"
  stop_pid "${run}/containerd.pid"
  stop_pid "${run}/crio.pid"
  kill_cgroup "qos-${name}"
  # shellcheck disable=SC2086
  [[ -z "${shims// /}" ]] || kill -9 ${shims} 2>/dev/null || true
  # containerd puts each shim's socket in the fixed /run/containerd/s/<sha256(address/namespace/id)>
  local task
  for task in "${run}"/containerd/io.containerd.runtime.v2.task/*/*; do
    [[ -d "${task}" ]] || continue
    rm -f "/run/containerd/s/$(printf '%s' "${run}/containerd.sock/$(basename "$(dirname "${task}")")/$(basename "${task}")" \
      | sha256sum | cut -c1-64)"
  done
  unmount_under "${run}"
  unmount_under "${NODES_ROOT}/${name}"
  remove_cgroup "qos-${name}"
  # pod logs (the in-cluster extender's among them) outlive the node: local-down --keep-logs keeps $LOGS
  if [[ -d "${NODES_ROOT}/${name}/logs" ]]; then
    mkdir -p "${LOGS}/${name}-pods" && cp -a "${NODES_ROOT}/${name}/logs/." "${LOGS}/${name}-pods/" 2>/dev/null || true
  fi
  ip netns delete "qos-${name}" 2>/dev/null || true
  ip link delete "qosv-${idx}" 2>/dev/null || true
  ip route delete "$(node_cidr "${idx}")" 2>/dev/null || true
  rm -rf "${run}" "${NODES_ROOT:?}/${name}"
}

# ---------------------------------------------------------------- commands
claim_owner() {
  mkdir -p "${RUN_ROOT}" "${NODES_ROOT}"
  local owner
  owner="$(cat "${RUN_ROOT}/owner" 2>/dev/null || true)"
  if [[ -n "${owner}" && "${owner}" != "${QOS_STATE}" && -d "${owner}" && -s "${owner}/real-nodes" ]]; then
    die "real nodes belong to the local cluster in ${owner}; stop it first (QOS_STATE=${owner} hack/local-down.sh)"
  fi
  echo "${QOS_STATE}" > "${RUN_ROOT}/owner"
}

# kubelet (protectKernelDefaults false, its default) sets these host-wide sysctls to what it wants
# (kernel.panic=10, kernel.panic_on_oops=1, vm.overcommit_memory=1): a developer's machine must get its own
# values back when the last real node goes. Saved once, before the first kubelet of a run; restored by `down`.
HOST_SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory)
save_host_sysctls() {
  [[ -s "${RUN_ROOT}/host-sysctls" ]] && return 0
  local key
  for key in "${HOST_SYSCTLS[@]}"; do echo "${key}=$(sysctl -n "${key}")"; done > "${RUN_ROOT}/host-sysctls.tmp"
  mv "${RUN_ROOT}/host-sysctls.tmp" "${RUN_ROOT}/host-sysctls"
}
restore_host_sysctls() {
  [[ -s "${RUN_ROOT}/host-sysctls" ]] || return 0
  local line
  while read -r line; do sysctl -qw "${line}" || log "sysctl ${line} not restored"; done < "${RUN_ROOT}/host-sysctls"
  rm -f "${RUN_ROOT}/host-sysctls"
}

up() {
  (($#)) || return 0
  [[ -x "${BIN_DIR}/kubelet" && -x "${BIN_DIR}/containerd" && -x "${BIN_DIR}/runc" ]] \
    || die "real nodes need kubelet, containerd and runc in ${BIN_DIR} (run hack/build-tools.sh)"
  [[ -x "${CRIU_DIR}/criu" ]] || "${HACK_DIR}/build-criu.sh" >/dev/null
  [[ "${NODE_RUNTIME}" == containerd || "${NODE_RUNTIME}" == crio ]] \
    || die "QOS_NODE_RUNTIME must be containerd or crio, not '${NODE_RUNTIME}'"
  if [[ "${NODE_RUNTIME}" == crio ]]; then
    if [[ ! -x "${BIN_DIR}/crio" || ! -x "${BIN_DIR}/pinns" ]] || ! command -v conmon >/dev/null \
      || ! command -v skopeo >/dev/null || { ! command -v nft >/dev/null && [[ ! -x /usr/sbin/nft ]]; }; then
      "${HACK_DIR}/build-crio.sh" >/dev/null
    fi
  fi
  command -v nsenter >/dev/null || die "nsenter (util-linux) is required"
  local t0=${SECONDS} arg group flavour count i name idx wanted=()
  # every argument is checked before anything is made: a bad one must not leave a half-built fabric
  for arg in "$@"; do
    [[ "${arg}" =~ ^(([a-z]+):)?([A-Za-z0-9._-]+)=([0-9]+)$ ]] || die "bad real node argument '${arg}'"
    [[ "${BASH_REMATCH[2]:-service}" == service || "${BASH_REMATCH[2]}" == batch ]] \
      || die "node group must be service or batch: '${arg}'"
  done
  claim_owner
  save_host_sysctls
  touch "${REGISTRY}"
  ensure_fabric
  for arg in "$@"; do
    [[ "${arg}" =~ ^(([a-z]+):)?([A-Za-z0-9._-]+)=([0-9]+)$ ]]
    group="${BASH_REMATCH[2]:-service}" flavour="${BASH_REMATCH[3]}" count="${BASH_REMATCH[4]}"
    for ((i = 0; i < count; i++)); do
      name="real-${group}-${flavour//./-}-${i}"
      wanted+=("${name}")
      if ! grep -q "^${name} " "${REGISTRY}"; then
        idx=1
        while awk -v i="${idx}" '$2 == i {f = 1} END {exit !f}' "${REGISTRY}"; do idx=$((idx + 1)); done
        ((idx < 240)) || die "too many real nodes"
        echo "${name} ${idx} ${group} ${flavour}" >> "${REGISTRY}"
      fi
      # the runtime is chosen when the node is made: a node keeps it until it goes (down, remove)
      if [[ ! -s "${NODES_ROOT}/${name}/runtime" ]]; then
        mkdir -p "${NODES_ROOT}/${name}"
        echo "${NODE_RUNTIME}" > "${NODES_ROOT}/${name}/runtime"
      fi
    done
    # nodes of this group/flavour beyond COUNT go away
    while read -r name idx _ _; do
      if [[ "${name}" == "real-${group}-${flavour//./-}-"* ]] && [[ " ${wanted[*]} " != *" ${name} "* ]]; then
        log "${name}: removing (not wanted)"
        "${KUBECTL[@]}" delete node "${name}" --wait=false >/dev/null 2>&1 || true
        stop_node "${name}" "${idx}"
        sed -i "/^${name} /d" "${REGISTRY}"
      fi
    done < <(cat "${REGISTRY}")
  done
  while read -r name idx _ _; do ensure_netns "qos-${name}" "$(node_ip "${idx}")" "qosv-${idx}"; done < "${REGISTRY}"
  sync_routes
  while read -r name idx group flavour; do
    start_node "${name}" "${idx}" "${group}" "${flavour}"
  done < "${REGISTRY}"
  kubelet_targets
  local names=()
  while read -r name _ _ _; do names+=("node/${name}"); done < "${REGISTRY}"
  if ((${#names[@]} == 0)); then log "real nodes: none wanted"; return 0; fi
  local deadline=$((SECONDS + 120))
  until "${KUBECTL[@]}" get "${names[@]}" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "real nodes did not register; see ${LOGS}/*-kubelet.log"
    sleep 0.5
  done
  # (a budget of its own: `kubectl wait --timeout` <= 0 would mean a week)
  "${KUBECTL[@]}" wait --for=condition=Ready --timeout=120s "${names[@]}" >&2 \
    || die "real nodes not Ready; see ${LOGS}/*-kubelet.log"
  while read -r name _ _ _; do
    "${KUBECTL[@]}" annotate --overwrite node "${name}" \
      "qos.kube-qos-extender.io/price-per-hour=$(cat "${NODES_ROOT}/${name}/price")" >/dev/null
  done < "${REGISTRY}"
  log "real nodes: ${#names[@]} Ready in $((SECONDS - t0))s"
}

down() {
  local name idx failed=0
  if [[ -f "${REGISTRY}" ]]; then
    while read -r name idx _ _; do
      # (one node failing to go must not orphan the others: carry on, report at the end)
      if (stop_node "${name}" "${idx}"); then log "${name}: removed"; else log "${name}: teardown FAILED"; failed=1; fi
    done < "${REGISTRY}"
  fi
  stop_pid "${QOS_STATE}/pids/apigw-relay.pid"
  stop_pid "${QOS_STATE}/pids/prom-pod-sd.pid"
  ip netns delete "${APIGW_NS}" 2>/dev/null || true
  ip link delete qosv-apigw 2>/dev/null || true
  ip link delete "${BRIDGE}" 2>/dev/null || true
  ip route delete unreachable "${POD_CIDR_ALL}" 2>/dev/null || true
  ip route delete unreachable 10.250.0.0/16 2>/dev/null || true
  # the one path every kubelet hard-codes whatever its --root-dir (the device-plugin registration socket)
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null || true
  ((failed == 0)) || return 1
  rm -f "${REGISTRY}"
  kubelet_targets
  restore_host_sysctls
  if [[ "$(cat "${RUN_ROOT}/owner" 2>/dev/null)" == "${QOS_STATE}" ]]; then rm -f "${RUN_ROOT}/owner"; fi
  # the shared bind mount of ensure_shared_nodes_root (CRI-O nodes), once every node's mounts below it are gone
  if [[ -d "${NODES_ROOT}" && "$(findmnt -n -o TARGET --target "${NODES_ROOT}")" == "${NODES_ROOT}" ]]; then
    umount "${NODES_ROOT}" || umount -l "${NODES_ROOT}"
  fi
  rmdir "${RUN_ROOT}" "${NODES_ROOT}" 2>/dev/null || true
}

leftovers() {
  local found=()
  mapfile -t -O "${#found[@]}" found < <(ip netns list 2>/dev/null | awk '$1 ~ /^qos-/ {print "netns " $1}')
  mapfile -t -O "${#found[@]}" found < <(ip -o link show 2>/dev/null | awk -F': ' '$2 ~ /^(qosbr0|qosv-)/ {print "link " $2}')
  mapfile -t -O "${#found[@]}" found < <(cg_hierarchies | while read -r h; do
    find "${h}" -mindepth 1 -maxdepth 1 -type d -name 'qos-*' -printf 'cgroup %p\n'; done)
  mapfile -t -O "${#found[@]}" found < <(awk -v a="${NODES_ROOT}" -v b="${RUN_ROOT}" \
    'index($2, a) == 1 || index($2, b) == 1 {print "mount " $2}' /proc/self/mounts)
  mapfile -t -O "${#found[@]}" found < <(pgrep -a -f "${RUN_ROOT}|${NODES_ROOT}|netns_relay.py|prom_pod_sd.py" 2>/dev/null \
    | grep -v "real-nodes.sh" | sed 's/^/process /' || true)
  [[ -e "${NODES_ROOT}" ]] && found+=("dir ${NODES_ROOT}")
  [[ -e "${RUN_ROOT}" ]] && found+=("dir ${RUN_ROOT}")
  if ((${#found[@]})); then
    printf 'left over: %s\n' "${found[@]}" >&2
    return 1
  fi
  log "real nodes: nothing left over"
}

# Prometheus targets for the kubelets' /metrics/resource (hack/local-up.sh's job kubelet-resource): one per
# registered node, labelled with its name; rewritten (atomically: Prometheus watches the file) whenever the
# registry changes, and emptied by `down`.
kubelet_targets() {
  local out="${QOS_STATE}/config/real-kubelet-targets.json" name idx sep="" body="["
  mkdir -p "${QOS_STATE}/config"
  if [[ -f "${REGISTRY}" ]]; then
    while read -r name idx _ _; do
      body+="${sep}{\"targets\": [\"$(node_ip "${idx}"):10250\"], \"labels\": {\"node\": \"${name}\"}}"
      sep=", "
    done < "${REGISTRY}"
  fi
  printf '%s]\n' "${body}" > "${out}.tmp"
  mv -f "${out}.tmp" "${out}"
}

registered() { # <name> -> its registry line "name idx group flavour", or die
  local line
  line="$(awk -v n="$1" '$1 == n' "${REGISTRY}" 2>/dev/null)"
  [[ -n "${line}" ]] || die "no real node $1 in ${QOS_STATE}"
  echo "${line}"
}

remove() {
  local name idx
  for name in "$@"; do
    read -r _ idx _ _ <<< "$(registered "${name}")"
    "${KUBECTL[@]}" delete node "${name}" --wait=false >/dev/null 2>&1 || true
    stop_node "${name}" "${idx}"
    sed -i "/^${name} /d" "${REGISTRY}"
    log "${name}: removed"
  done
  kubelet_targets
}

restart() { # <kubelet|runtime> NAME...
  local what="$1" name idx group flavour t
  shift
  for name in "$@"; do
    read -r _ idx group flavour <<< "$(registered "${name}")"
    [[ "${what}" == kubelet ]] || what="$(node_runtime "${name}")"
    stop_pid "${RUN_ROOT}/${name}/${what}.pid"
    start_node "${name}" "${idx}" "${group}" "${flavour}"  # starts only what is not running: the one stopped
    t=$((SECONDS + 120))
    until "${KUBECTL[@]}" get "node/${name}" >/dev/null 2>&1; do
      ((SECONDS < t)) || die "${name} did not register again; see ${LOGS}/${name}-kubelet.log"
      sleep 0.5
    done
    "${KUBECTL[@]}" annotate --overwrite node "${name}" \
      "qos.kube-qos-extender.io/price-per-hour=$(cat "${NODES_ROOT}/${name}/price")" >/dev/null
    log "${name}: ${what} restarted, node registered"
  done
}

case "${cmd}" in
  up) up "$@" ;;
  remove) remove "$@" ;;
  restart-kubelet) restart kubelet "$@" ;;
  restart-containerd|restart-runtime) restart runtime "$@" ;;
  leftovers) leftovers ;;
  down) down ;;
  import)
    [[ -f "${REGISTRY}" ]] || die "no real nodes in ${QOS_STATE}"
    while read -r name _ _ _; do
      for tar in "$@"; do rm -f "$(import_stamp "${name}" "${tar}")"; done
      import_images "${name}" "$@"
    done < "${REGISTRY}" ;;
  list)
    [[ -f "${REGISTRY}" ]] || exit 0
    while read -r name idx _ _; do echo "${name} $(node_ip "${idx}") $(node_cidr "${idx}")"; done < "${REGISTRY}" ;;
  -h|--help|"") awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0" ;;
  *) die "unknown command: ${cmd}" ;;
esac
