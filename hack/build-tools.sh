#!/usr/bin/env bash
# Build (or reuse) the local control-plane binaries for the pinned versions in hack/versions.env:
#   kube-apiserver kube-scheduler kube-controller-manager kubectl  (k8s.io/kubernetes, hack/tools)
#   kwok                                                           (sigs.k8s.io/kwok, hack/tools/kwok)
#   etcd                                                           (go.etcd.io/etcd/server/v3, hack/tools/etcd)
#   kubelet kube-proxy                                             (k8s.io/kubernetes, hack/tools: real nodes)
#   kubeadm                                                        (k8s.io/kubernetes, hack/tools: kind's nodes)
#   containerd ctr containerd-shim-runc-v2                         (containerd v2, hack/tools/containerd)
#   runc                                                           (opencontainers/runc, hack/tools/runc; cgo)
#   CNI plugins, iptables, libseccomp                              (Debian packages containernetworking-plugins ...)
#   prometheus, promtool                                           (Debian package, symlinked)
# into ${QOS_CACHE:-~/.cache/kube-qos-extender}/<KUBE_VERSION>/bin and print that directory on stdout
# (last line; progress goes to stderr). Idempotent: a binary is reused when it exists and its stamp
# file (.NAME.version) matches the pinned version.
#
# Options:
#   --sync     rewrite hack/tools{,/kwok,/etcd}/go.mod from versions.env and `go mod tidy` (needs network)
#   --force    rebuild the Go binaries even if present
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SYNC=0 FORCE=0
for arg in "$@"; do
  case "${arg}" in
    --sync) SYNC=1 ;;
    --force) FORCE=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) die "unknown argument: ${arg}" ;;
  esac
done

command -v go >/dev/null || die "go is required (go >= 1.25)"
export GOMODCACHE="${QOS_CACHE}/go/mod"
export GOCACHE="${QOS_CACHE}/go/build"
export GOTOOLCHAIN=local
export GOFLAGS="-buildvcs=false -mod=readonly"
export CGO_ENABLED="${CGO_ENABLED:-0}"
mkdir -p "${BIN_DIR}" "${SHARE_DIR}" "${GOMODCACHE}" "${GOCACHE}"

TOOLS_DIR="${HACK_DIR}/tools"
KWOK_TOOLS_DIR="${HACK_DIR}/tools/kwok"
ETCD_TOOLS_DIR="${HACK_DIR}/tools/etcd"
CONTAINERD_TOOLS_DIR="${HACK_DIR}/tools/containerd"
RUNC_TOOLS_DIR="${HACK_DIR}/tools/runc"

sync_modules() {
  local staging_version="v0${KUBE_VERSION#v1}"
  local gomod
  log "syncing ${TOOLS_DIR}/go.mod to k8s.io/kubernetes ${KUBE_VERSION} (staging ${staging_version})"
  gomod="$(cd "${TOOLS_DIR}" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  [[ -f "${gomod}" ]] || die "could not download k8s.io/kubernetes@${KUBE_VERSION}"
  # Regenerated whole: module line, the k8s.io/kubernetes requirement and one replace per staging
  # module (k8s.io/kubernetes requires them as v0.0.0 and replaces them with ./staging/...), then tidy.
  {
    printf 'module github.com/kube-qos-extender/hack/tools\n\ngo 1.25.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' \
      "${KUBE_VERSION}"
    awk -v v="${staging_version}" '$2 == "=>" && $3 ~ /^\.\/staging/ {printf "\t%s => %s %s\n", $1, $1, v}' "${gomod}"
    printf ')\n'
  } > "${TOOLS_DIR}/go.mod"
  (cd "${TOOLS_DIR}" && GOFLAGS=-mod=mod go mod tidy)
  log "syncing ${KWOK_TOOLS_DIR}/go.mod to sigs.k8s.io/kwok ${KWOK_VERSION}"
  (cd "${KWOK_TOOLS_DIR}" && go mod edit -require="sigs.k8s.io/kwok@${KWOK_VERSION}" && GOFLAGS=-mod=mod go mod tidy)
  log "syncing ${ETCD_TOOLS_DIR}/go.mod to go.etcd.io/etcd/server/v3 ${ETCD_VERSION}"
  (cd "${ETCD_TOOLS_DIR}" && go mod edit -require="go.etcd.io/etcd/server/v3@${ETCD_VERSION}" && GOFLAGS=-mod=mod go mod tidy)
  log "syncing containerd ${CONTAINERD_VERSION} and runc ${RUNC_VERSION} modules"
  (cd "${CONTAINERD_TOOLS_DIR}" && go mod edit -require="github.com/containerd/containerd/v2@${CONTAINERD_VERSION}" \
    && GOFLAGS=-mod=mod go mod tidy)
  (cd "${RUNC_TOOLS_DIR}" && go mod edit -require="github.com/opencontainers/runc@${RUNC_VERSION}" && GOFLAGS=-mod=mod go mod tidy)
}

check_modules() {
  grep -q "k8s.io/kubernetes ${KUBE_VERSION}\$" "${TOOLS_DIR}/go.mod" \
    || die "hack/tools/go.mod does not require k8s.io/kubernetes ${KUBE_VERSION}; run: hack/build-tools.sh --sync"
  grep -q "sigs.k8s.io/kwok ${KWOK_VERSION}\$" "${KWOK_TOOLS_DIR}/go.mod" \
    || die "hack/tools/kwok/go.mod does not require sigs.k8s.io/kwok ${KWOK_VERSION}; run: hack/build-tools.sh --sync"
  grep -q "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}\$" "${ETCD_TOOLS_DIR}/go.mod" \
    || die "hack/tools/etcd/go.mod does not require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}; run: hack/build-tools.sh --sync"
  grep -q "github.com/containerd/containerd/v2 ${CONTAINERD_VERSION}\$" "${CONTAINERD_TOOLS_DIR}/go.mod" \
    || die "hack/tools/containerd/go.mod does not require containerd ${CONTAINERD_VERSION}; run: hack/build-tools.sh --sync"
  grep -q "github.com/opencontainers/runc ${RUNC_VERSION}\$" "${RUNC_TOOLS_DIR}/go.mod" \
    || die "hack/tools/runc/go.mod does not require runc ${RUNC_VERSION}; run: hack/build-tools.sh --sync"
}

# Version information the upstream Makefile would inject (hack/lib/version.sh), so that
# `kube-apiserver --version` and GET /version report the real release instead of v0.0.0-master.
kube_ldflags() {
  local minor="${KUBE_VERSION#v1.}"
  minor="${minor%%.*}"
  local kv=(
    "gitVersion=${KUBE_VERSION}" "gitMajor=1" "gitMinor=${minor}"
    "gitCommit=${KUBE_GIT_COMMIT:-}" "gitTreeState=clean" "buildDate=${KUBE_BUILD_DATE:-1970-01-01T00:00:00Z}"
  )
  local flags="-s -w" p
  for p in "${kv[@]}"; do
    flags+=" -X k8s.io/component-base/version.${p} -X k8s.io/client-go/pkg/version.${p}"
  done
  printf '%s' "${flags}"
}

build_go() { # <module dir> <output name> <version stamp> <package> [extra go build args...]
  local dir="$1" name="$2" version="$3" pkg="$4"
  shift 4
  local stamp="${BIN_DIR}/.${name}.version"
  if [[ "${FORCE}" == 0 && -x "${BIN_DIR}/${name}" && ! -L "${BIN_DIR}/${name}" \
        && "$(cat "${stamp}" 2>/dev/null)" == "${version}" ]]; then
    log "${name}: ${version} present, skipping build"
    return 0
  fi
  log "${name}: building ${pkg} ${version}"
  local start=${SECONDS}
  (cd "${dir}" && go build -trimpath "$@" -o "${BIN_DIR}/.${name}.tmp" "${pkg}")
  rm -f "${BIN_DIR}/${name}"
  mv -f "${BIN_DIR}/.${name}.tmp" "${BIN_DIR}/${name}"
  echo "${version}" > "${stamp}"
  log "${name}: built in $((SECONDS - start))s"
}

install_kwok_stages() {
  # Standalone kwok refuses to start without Stage objects; kwokctl normally supplies its embedded
  # defaults. Assemble the same defaults (node-fast init + heartbeat-with-lease, pod-fast) from the module.
  local out="${SHARE_DIR}/kwok-stages-${KWOK_VERSION}.yaml"
  [[ -s "${out}" && "${FORCE}" == 0 ]] && return 0
  local dir
  dir="$(cd "${KWOK_TOOLS_DIR}" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  [[ -d "${dir}" ]] || (cd "${KWOK_TOOLS_DIR}" && go mod download sigs.k8s.io/kwok)
  dir="$(cd "${KWOK_TOOLS_DIR}" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  local s f first=1
  : > "${out}.tmp"
  for s in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    f="${dir}/kustomize/stage/${s}"
    [[ -f "${f}" ]] || die "kwok stage ${s} not found in ${dir}"
    [[ "${first}" == 1 ]] || echo '---' >> "${out}.tmp"
    first=0
    cat "${f}" >> "${out}.tmp"
  done
  mv -f "${out}.tmp" "${out}"
  log "kwok stages: ${out}"
}

# Stop a packaged daemon that the Debian maintainer scripts may have started (it would listen on all
# interfaces); only processes owned by the package's system user are touched.
stop_packaged_service() { # <service> <process name> <user>
  local svc="$1" proc="$2" user="$3"
  if [[ "$(ps -p 1 -o comm= 2>/dev/null)" == systemd ]] && command -v systemctl >/dev/null; then
    systemctl disable --now "${svc}" >/dev/null 2>&1 || true
  fi
  local pids
  pids="$(pgrep -u "${user}" -x "${proc}" 2>/dev/null || true)"
  if [[ -n "${pids}" ]]; then
    log "stopping packaged ${svc} service (pids ${pids//$'\n'/ })"
    # shellcheck disable=SC2086
    kill ${pids} 2>/dev/null || true
  fi
}

install_prometheus() {
  if ! command -v prometheus >/dev/null; then
    log "prometheus: installing Debian package ${PROMETHEUS_DEBIAN_PACKAGE} (no recommends: no node-exporter)"
    apt_install_no_start "${PROMETHEUS_DEBIAN_PACKAGE}"
  fi
  stop_packaged_service prometheus prometheus prometheus
  ln -sfn "$(command -v prometheus)" "${BIN_DIR}/prometheus"
  if command -v promtool >/dev/null; then ln -sfn "$(command -v promtool)" "${BIN_DIR}/promtool"; fi
}

# Real (kubelet) nodes: Debian's CNI plugins (bridge, host-local, loopback, portmap), iptables for kube-proxy
# inside each node's network namespace, libseccomp for runc's cgo build, iproute2 for the namespaces.
install_node_packages() {
  local want=() p
  for p in containernetworking-plugins iptables libseccomp-dev iproute2 conntrack; do
    dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q 'install ok installed' || want+=("${p}")
  done
  if ((${#want[@]})); then
    log "node packages: installing ${want[*]}"
    apt_install_no_start "${want[@]}"
  fi
  [[ -x /usr/lib/cni/bridge ]] || die "CNI plugins missing: /usr/lib/cni/bridge (package containernetworking-plugins)"
  ln -sfn /usr/lib/cni "${BIN_DIR}/cni"
}

build_node_runtime() {
  local cversion="${CONTAINERD_VERSION}"
  local cflags="-s -w -X github.com/containerd/containerd/v2/version.Version=${cversion}"
  cflags+=" -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
  local c
  for c in containerd ctr containerd-shim-runc-v2; do
    build_go "${CONTAINERD_TOOLS_DIR}" "${c}" "${cversion}" "github.com/containerd/containerd/v2/cmd/${c}" \
      -tags "no_btrfs no_devmapper no_zfs" -ldflags "${cflags}"
  done
  # runc needs cgo (nsenter is C) and libseccomp for the seccomp profiles the kubelet asks for.
  CGO_ENABLED=1 build_go "${RUNC_TOOLS_DIR}" runc "${RUNC_VERSION}" github.com/opencontainers/runc \
    -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}"
}

total_start=${SECONDS}
if [[ "${SYNC}" == 1 ]]; then sync_modules; fi
check_modules

for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy kubeadm; do
  build_go "${TOOLS_DIR}" "${cmd}" "${KUBE_VERSION}" "k8s.io/kubernetes/cmd/${cmd}" \
    -tags providerless -ldflags "$(kube_ldflags)"
done
build_go "${KWOK_TOOLS_DIR}" kwok "${KWOK_VERSION}" sigs.k8s.io/kwok/cmd/kwok -ldflags "-s -w"
build_go "${ETCD_TOOLS_DIR}" etcd "${ETCD_VERSION}" go.etcd.io/etcd/server/v3 -ldflags "-s -w"
install_kwok_stages
install_prometheus
install_node_packages
build_node_runtime

log "tools ready in $((SECONDS - total_start))s: $(find "${BIN_DIR}" -mindepth 1 -maxdepth 1 ! -name '.*' -printf '%f ')"
echo "${BIN_DIR}"
