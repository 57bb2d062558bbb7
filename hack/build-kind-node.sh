#!/usr/bin/env bash
# Build, without any registry, what `kind create cluster` would otherwise pull: the kind binary and a kind node
# image of KUBE_VERSION holding every image kubeadm asks for. On a machine with a registry none of this is
# needed: hack/kind-up.sh then uses the official kindest/node (QOS_KIND_NODE_IMAGE=kindest/node:<version>).
#
#   binaries   kind (sigs.k8s.io/kind ${KIND_VERSION}), crictl (sigs.k8s.io/cri-tools ${CRICTL_VERSION}), coredns
#              (github.com/coredns/coredns ${COREDNS_VERSION}); the rest from hack/build-tools.sh (kubeadm,
#              kubelet, kubectl, control plane, etcd, containerd, runc)
#   images     registry.k8s.io/{kube-apiserver,kube-controller-manager,kube-scheduler,kube-proxy}:${KUBE_VERSION},
#              etcd:${KIND_ETCD_TAG} (our etcd under kubeadm's tag), coredns/coredns:${COREDNS_VERSION},
#              pause:3.10.1 (hack/build-image.sh's) -- a static binary in a minimal rootfs (`docker import`);
#              kube-proxy on the node rootfs (it needs iptables, conntrack) behind a wrapper choosing
#              iptables-nft or -legacy as kind's own image does (by the kubelet's KUBE-IPTABLES-HINT chain)
#   node image qos-local/kind-node:${KUBE_VERSION}: debootstrap bookworm (systemd; trixie's systemd refuses
#              cgroup v1) + kind's own base files from the kind module (entrypoint, systemd units, kubelet
#              drop-ins, containerd config) + the binaries + the images above imported into its containerd
#              content store by a private containerd on the host (CRI off, its own socket and state) + our
#              default CNI (hack/kind/: containerd's conf_template and a route DaemonSet instead of kindnetd)
#
# Idempotent: every image carries the hash of its inputs (label qos.kube-qos-extender.io/inputs) and is rebuilt
# only when they change; the debootstrapped rootfs is cached in ${QOS_CACHE}/image-build. Needs the docker engine
# hack/build-image.sh starts (it runs it first when `docker info` fails) and hack/build-tools.sh's binaries.
# Prints KIND=<path> and KIND_NODE_IMAGE=<tag> on stdout; progress on stderr. Option: --force.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FORCE=0
for arg in "$@"; do
  case "${arg}" in
    --force) FORCE=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) die "unknown argument: ${arg}" ;;
  esac
done

WORK_DIR="${QOS_CACHE}/image-build"
KIND_DIR="${QOS_CACHE}/kind/${KIND_VERSION}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
NODE_PACKAGES=systemd,systemd-sysv,dbus,iptables,nftables,iproute2,conntrack,ethtool,util-linux,mount,kmod,procps
NODE_PACKAGES+=,libseccomp2,ca-certificates,jq,containernetworking-plugins,socat,ebtables,bash,curl,pigz
# CRIU's libraries (the binary is hack/build-criu.sh's: bookworm's criu 3.17 fails on kernels >= 6.13)
NODE_PACKAGES+=,libprotobuf-c1,libnl-3-200,libnet1,libgnutls30,libbsd0,libuuid1
NODE_IMAGE="qos-local/kind-node:${KUBE_VERSION}"
LABEL=qos.kube-qos-extender.io/inputs
mkdir -p "${WORK_DIR}" "${KIND_DIR}/bin"

sha() { sha256sum | cut -c1-16; }
# one build at a time (two kind-up runs may start together; the second waits, then finds the images current)
exec 8> "${KIND_DIR}/.lock"
if ! flock -n 8; then log "another hack/build-kind-node.sh is running: waiting"; flock 8; fi
# A host whose root lacks CAP_SYS_RESOURCE (these CI machines) cannot let runc lower OOM scores: detected here,
# the node's containerd then restricts oom_score_adj (restrict_oom_score_adj, as rootless setups do)
if (( (16#$(sed -n 's/^CapBnd:[[:space:]]*//p' /proc/self/status) >> 24) & 1 )); then RESTRICT_OOM=false; else RESTRICT_OOM=true; fi
command -v docker >/dev/null && docker info >/dev/null 2>&1 || {
  log "no docker engine answers: hack/build-image.sh starts one (and builds the project's images)"
  "${HACK_DIR}/build-image.sh" >&2
}
docker info >/dev/null 2>&1 || die "the docker engine does not answer \`docker info\`"

export GOMODCACHE="${QOS_CACHE}/go/mod" GOCACHE="${QOS_CACHE}/go/build" GOTOOLCHAIN=local GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0
for b in kubelet kubectl kubeadm kube-apiserver kube-controller-manager kube-scheduler kube-proxy etcd containerd ctr \
         containerd-shim-runc-v2 runc; do
  [[ -x "${BIN_DIR}/${b}" ]] || { log "${b} missing: hack/build-tools.sh"; "${HACK_DIR}/build-tools.sh" >&2; break; }
done
# CRIU in the nodes: the kubelet's checkpoints and containerd's restores (the node agent's migrations)
CRIU_BIN="${QOS_CACHE}/criu-${CRIU_VERSION}/criu"
[[ -x "${CRIU_BIN}" ]] || "${HACK_DIR}/build-criu.sh" --no-check >&2

# ------------------------------------------------------------------------------------------------ binaries
go_install() { # <name> <package@version>: `go install` of a pinned module version into ${KIND_DIR}/bin
  local name="$1" pkg="$2" stamp="${KIND_DIR}/bin/.$1.version"
  if [[ "${FORCE}" == 0 && -x "${KIND_DIR}/bin/${name}" && "$(cat "${stamp}" 2>/dev/null)" == "${pkg}" ]]; then return 0; fi
  log "${name}: go install ${pkg}"
  local start=${SECONDS}
  GOBIN="${KIND_DIR}/bin" GOFLAGS="-buildvcs=false -trimpath" go install -ldflags "-s -w" "${pkg}"
  echo "${pkg}" > "${stamp}"
  log "${name}: built in $((SECONDS - start))s"
}
go_install kind "sigs.k8s.io/kind@${KIND_VERSION}"
go_install crictl "sigs.k8s.io/cri-tools/cmd/crictl@${CRICTL_VERSION}"
go_install coredns "github.com/coredns/coredns@${COREDNS_VERSION}"
KIND_SRC="$(cd "${HACK_DIR}/tools" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@${KIND_VERSION}" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -d "${KIND_SRC}/images/base/files" ]] || die "kind's base image files not found in ${KIND_SRC}"

# ------------------------------------------------------------------------------------------------ helpers
image_inputs() { docker image inspect -f "{{ index .Config.Labels \"${LABEL}\" }}" "$1" 2>/dev/null || true; }
current() { [[ "${FORCE}" == 0 && "$(image_inputs "$1")" == "$2" ]]; }

minimal_image() { # <tag> <binary> <entrypoint json> <inputs>: a static binary in a minimal rootfs, as root
  local tag="$1" bin="$2" entry="$3" inputs="$4" dir="${WORK_DIR}/rootfs-kind-min"
  current "${tag}" "${inputs}" && return 0
  rm -rf "${dir}"
  mkdir -p "${dir}/usr/local/bin" "${dir}/tmp" "${dir}/etc/ssl/certs" "${dir}/var/run"
  if readelf -lW "${bin}" | grep -q INTERP; then  # dynamic (Debian's prometheus: glibc only): its libraries too
    local lib
    for lib in $(ldd "${bin}" | grep -o '/[^ ]*'); do install -D -m 0755 "$(readlink -f "${lib}")" "${dir}${lib}"; done
  fi
  install -m 0755 "${bin}" "${dir}/usr/local/bin/$(basename "${bin}")"
  chmod 1777 "${dir}/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "${dir}/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' > "${dir}/etc/group"
  echo 'hosts: files dns' > "${dir}/etc/nsswitch.conf"
  cp /etc/ssl/certs/ca-certificates.crt "${dir}/etc/ssl/certs/"
  tar --numeric-owner --owner=0 --group=0 -C "${dir}" -c . \
    | docker import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' --change "ENTRYPOINT ${entry}" \
        --change "LABEL ${LABEL}=${inputs}" --message "$(basename "${bin}") for the kind node image" - "${tag}" >&2
  rm -rf "${dir}"
  log "image ${tag}: built"
}

# ------------------------------------------------------------------------------------------------ node rootfs
node_rootfs() { # prints the path of the cached debootstrapped rootfs tar (bookworm + NODE_PACKAGES, cleaned)
  local key tar dir
  key="$(printf '%s\n' "${NODE_PACKAGES}" "$(declare -f node_rootfs)" | sha)"
  tar="${WORK_DIR}/kind-node-bookworm-${key}.tar"
  if [[ -s "${tar}" ]]; then echo "${tar}"; return 0; fi
  dir="${WORK_DIR}/rootfs-kind-node"
  rm -rf "${dir}"
  mkdir -p "${dir}"
  local start=${SECONDS}
  log "node rootfs: debootstrap --variant=minbase bookworm (+ ${NODE_PACKAGES})"
  debootstrap --variant=minbase --keyring="${KEYRING}" --include="${NODE_PACKAGES}" bookworm "${dir}" \
    "${DEBIAN_MIRROR}" > "${WORK_DIR}/kind-debootstrap.log" 2>&1 \
    || { tail -n 30 "${WORK_DIR}/kind-debootstrap.log" >&2; die "debootstrap failed (${WORK_DIR}/kind-debootstrap.log)"; }
  rm -rf "${dir:?}"/var/lib/apt/lists/* "${dir:?}"/var/cache/apt/* "${dir:?}"/usr/share/doc/* "${dir:?}"/usr/share/man/* \
    "${dir:?}"/usr/share/info/* "${dir:?}"/usr/share/locale/* "${dir:?}"/var/log/* "${dir:?}"/tmp/* "${dir:?}"/dev/* \
    "${dir:?}"/proc/* "${dir:?}"/sys/*
  tar --numeric-owner --xattrs -C "${dir}" -cf "${tar}.tmp" .
  mv -f "${tar}.tmp" "${tar}"
  rm -rf "${dir}"
  log "node rootfs: $(du -h "${tar}" | cut -f1) in $((SECONDS - start))s -> ${tar}"
  echo "${tar}"
}
ROOTFS_TAR="$(node_rootfs)"

# ------------------------------------------------------------------------------------------------ images
# kubeadm's tags for KUBE_VERSION (`kubeadm config images list`): the etcd and coredns tags it asks for.
mapfile -t WANTED < <("${BIN_DIR}/kubeadm" config images list --kubernetes-version "${KUBE_VERSION}" 2>/dev/null)
((${#WANTED[@]} >= 7)) || die "kubeadm config images list printed ${#WANTED[*]} images: ${WANTED[*]}"
tag_of() { printf '%s\n' "${WANTED[@]}" | grep -m1 "/$1:" || die "kubeadm asks for no $1 image"; }
ETCD_TAG="$(tag_of etcd)"
COREDNS_TAG="$(tag_of coredns)"
PAUSE_TAG="$(tag_of pause)"
[[ "${COREDNS_TAG##*:}" == "${COREDNS_VERSION}" ]] || die "kubeadm wants ${COREDNS_TAG}; versions.env pins coredns ${COREDNS_VERSION}"

# Built under a private repository name and renamed to kubeadm's tag inside the node only: the engine keeps
# hack/build-image.sh's registry.k8s.io/kube-scheduler (non-root, for the qos-scheduler Deployment) untouched.
PRIV=qos-kind-build
IMAGES=()
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  in="$(sha256sum < "${BIN_DIR}/${c}" | cut -c1-16)-$(declare -f minimal_image | sha)"
  minimal_image "${PRIV}/${c}:${KUBE_VERSION}" "${BIN_DIR}/${c}" "[\"/usr/local/bin/${c}\"]" "${in}"
  IMAGES+=("${PRIV}/${c}:${KUBE_VERSION}=registry.k8s.io/${c}:${KUBE_VERSION}")
done
in="$(sha256sum < "${BIN_DIR}/etcd" | cut -c1-16)-$(declare -f minimal_image | sha)"
minimal_image "${PRIV}/etcd:${ETCD_TAG##*:}" "${BIN_DIR}/etcd" '["/usr/local/bin/etcd"]' "${in}"
IMAGES+=("${PRIV}/etcd:${ETCD_TAG##*:}=${ETCD_TAG}")
in="$(sha256sum < "${KIND_DIR}/bin/coredns" | cut -c1-16)-$(declare -f minimal_image | sha)"
minimal_image "${PRIV}/coredns:${COREDNS_VERSION}" "${KIND_DIR}/bin/coredns" '["/usr/local/bin/coredns"]' "${in}"
IMAGES+=("${PRIV}/coredns:${COREDNS_VERSION}=${COREDNS_TAG}")
# kwok (fakes the scale nodes, config/kind/kwok.yaml) and Debian's Prometheus (config/kind/prometheus.yaml)
in="$(sha256sum < "${BIN_DIR}/kwok" | cut -c1-16)-$(declare -f minimal_image | sha)"
minimal_image "qos-local/kwok:${KWOK_VERSION}" "${BIN_DIR}/kwok" '["/usr/local/bin/kwok"]' "${in}"
IMAGES+=("qos-local/kwok:${KWOK_VERSION}=qos-local/kwok:${KWOK_VERSION}")
prometheus="$(readlink -f "${BIN_DIR}/prometheus")"
in="$(sha256sum < "${prometheus}" | cut -c1-16)-$(declare -f minimal_image | sha)"
minimal_image qos-local/prometheus:bookworm "${prometheus}" '["/usr/local/bin/prometheus"]' "${in}"
IMAGES+=("qos-local/prometheus:bookworm=qos-local/prometheus:bookworm")
# busybox, the tests' workload image (hack/build-image.sh's)
busybox="$(docker images --format '{{.Repository}}:{{.Tag}}' qos-local/busybox | head -n1)"
[[ -n "${busybox}" ]] || die "qos-local/busybox not in the engine (hack/build-image.sh builds it)"
IMAGES+=("${busybox}=${busybox}")
# pause: hack/build-image.sh's static pause.c build (it tags the source's own tag, 3.10.1, too)
docker image inspect "${PAUSE_TAG}" >/dev/null 2>&1 || "${HACK_DIR}/build-image.sh" >&2
docker image inspect "${PAUSE_TAG}" >/dev/null 2>&1 || die "${PAUSE_TAG} not in the engine (hack/build-image.sh builds it)"
IMAGES+=("${PAUSE_TAG}=${PAUSE_TAG}")

# kube-proxy: the node rootfs (iptables, nft, conntrack; also bash, curl, jq, iproute2 for the route DaemonSet)
build_proxy() {
  local dir="${WORK_DIR}/rootfs-kind-proxy"
  rm -rf "${dir}"
  mkdir -p "${dir}"
  tar -C "${dir}" -xf "${ROOTFS_TAR}"
  install -m 0755 "${BIN_DIR}/kube-proxy" "${dir}/usr/local/bin/kube-proxy.bin"
  # kubeadm runs `/usr/local/bin/kube-proxy --config=...`: pick the iptables backend the kubelet uses (its
  # KUBE-IPTABLES-HINT chain), else the one holding more rules, then exec the real binary.
  cat > "${dir}/usr/local/bin/kube-proxy" <<'EOF'
#!/bin/bash
mode=legacy
if iptables-nft-save -t mangle 2>/dev/null | grep -q KUBE-IPTABLES-HINT; then mode=nft
elif ! iptables-legacy-save -t mangle 2>/dev/null | grep -q KUBE-IPTABLES-HINT; then
  (( $(iptables-nft-save 2>/dev/null | grep -c '^-') > $(iptables-legacy-save 2>/dev/null | grep -c '^-') )) && mode=nft
fi
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  update-alternatives --set "${t%%-*}" "/usr/sbin/${t%%-*}-${mode}" >/dev/null 2>&1 || true
done
exec /usr/local/bin/kube-proxy.bin "$@"
EOF
  chmod 0755 "${dir}/usr/local/bin/kube-proxy"
  tar --numeric-owner -C "${dir}" -c . \
    | docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENTRYPOINT ["/usr/local/bin/kube-proxy"]' --change "LABEL ${LABEL}=${proxy_inputs}" \
        --message "kube-proxy ${KUBE_VERSION} on Debian bookworm" - "${PRIV}/kube-proxy:${KUBE_VERSION}" >&2
  rm -rf "${dir}"
  log "image ${PRIV}/kube-proxy:${KUBE_VERSION}: built"
}
proxy_inputs="$(cat <(sha256sum < "${BIN_DIR}/kube-proxy") <(basename "${ROOTFS_TAR}") <(declare -f build_proxy) | sha)"
current "${PRIV}/kube-proxy:${KUBE_VERSION}" "${proxy_inputs}" || build_proxy
IMAGES+=("${PRIV}/kube-proxy:${KUBE_VERSION}=registry.k8s.io/kube-proxy:${KUBE_VERSION}")

# ------------------------------------------------------------------------------------------------ node image
build_node() {
  local dir="${WORK_DIR}/rootfs-kind-node-image" files="${KIND_SRC}/images/base/files" start=${SECONDS}
  rm -rf "${dir}"
  mkdir -p "${dir}"
  tar -C "${dir}" -xf "${ROOTFS_TAR}"
  # kind's base image (images/base/Dockerfile), from kind's own files
  install -m 0755 "${files}"/usr/local/bin/* "${dir}/usr/local/bin/"
  mkdir -p "${dir}/kind/bin" "${dir}/kind/manifests" "${dir}/etc/containerd" "${dir}/etc/systemd/system/kubelet.service.d" \
    "${dir}/etc/kubernetes/manifests" "${dir}/opt/cni/bin" "${dir}/etc/cni/net.d"
  install -m 0644 "${files}/kind/README.txt" "${dir}/kind/"
  install -m 0755 "${files}"/kind/bin/* "${dir}/kind/bin/"
  install -m 0644 "${files}/etc/crictl.yaml" "${dir}/etc/"
  install -m 0644 "${files}"/etc/default/* "${dir}/etc/default/"
  install -m 0644 "${files}"/etc/sysctl.d/* "${dir}/etc/sysctl.d/"
  install -m 0644 "${files}"/etc/systemd/system/*.service "${files}"/etc/systemd/system/*.slice "${dir}/etc/systemd/system/"
  install -m 0644 "${files}"/etc/systemd/system/kubelet.service.d/* "${dir}/etc/systemd/system/kubelet.service.d/"
  # kind's containerd config, up to three changes: kubeadm's pause tag; the CNI template; restrict_oom_score_adj
  # only where root lacks CAP_SYS_RESOURCE (RESTRICT_OOM, detected above)
  sed -e "s#sandbox_image = .*#sandbox_image = \"${PAUSE_TAG}\"#" \
      -e "s#restrict_oom_score_adj = false#restrict_oom_score_adj = ${RESTRICT_OOM}#" "${files}/etc/containerd/config.toml" \
    > "${dir}/etc/containerd/config.toml"
  # restores of kubelet checkpoint archives through CreateContainer (containerd 2.1-2.3; the node agent's
  # migrations, as on hack/real-nodes.sh's nodes)
  sed -i 's#^\[plugins."io.containerd.grpc.v1.cri"\]$#&\n  enable_experimental_restore_via_create = true#' "${dir}/etc/containerd/config.toml"
  grep -q enable_experimental_restore_via_create "${dir}/etc/containerd/config.toml" || die "kind's containerd config changed: no [plugins.\"io.containerd.grpc.v1.cri\"]"
  printf '\n[plugins."io.containerd.grpc.v1.cri".cni]\n  conf_template = "/etc/containerd/cni-template.json"\n' \
    >> "${dir}/etc/containerd/config.toml"
  grep -q "sandbox_image = \"${PAUSE_TAG}\"" "${dir}/etc/containerd/config.toml" || die "kind's containerd config changed: no sandbox_image"
  install -m 0644 "${HACK_DIR}/kind/containerd-cni.json" "${dir}/etc/containerd/cni-template.json"
  sed "s#KUBE_VERSION#${KUBE_VERSION}#" "${HACK_DIR}/kind/default-cni.yaml" > "${dir}/kind/manifests/default-cni.yaml"
  chroot "${dir}" /bin/sh -c '
    set -e
    find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
    rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
    echo "ReadKMsg=no" >> /etc/systemd/journald.conf
    ln -sf /usr/lib/systemd/systemd /sbin/init
    systemctl enable kubelet.service containerd.service undo-mount-hacks.service
    systemctl mask systemd-binfmt.service'
  local b
  for b in containerd ctr containerd-shim-runc-v2; do install -m 0755 "${BIN_DIR}/${b}" "${dir}/usr/local/bin/"; done
  install -m 0755 "${KIND_DIR}/bin/crictl" "${dir}/usr/local/bin/"
  install -m 0755 "${BIN_DIR}/runc" "${dir}/usr/local/sbin/runc"
  install -m 0755 "${CRIU_BIN}" "${dir}/usr/local/sbin/criu"
  for b in kubelet kubectl kubeadm; do install -m 0755 "${BIN_DIR}/${b}" "${dir}/usr/bin/"; done
  for b in /usr/lib/cni/*; do [[ -e "${dir}${b}" ]] && ln -sf "${b}" "${dir}/opt/cni/bin/$(basename "${b}")"; done
  # containerd's base OCI spec as kind makes it (+ its mount-product-files hook, without rlimits)
  "${BIN_DIR}/ctr" oci spec | python3 -c 'import json, sys
spec = json.load(sys.stdin)
spec.setdefault("hooks", {}).setdefault("createContainer", []).append({"path": "/kind/bin/mount-product-files.sh"})
spec["process"].pop("rlimits", None)
json.dump(spec, sys.stdout, indent=4)' > "${dir}/etc/containerd/cri-base.json"
  echo "${KUBE_VERSION}" > "${dir}/kind/version"
  # the images, into the node's content store: a private containerd on the host whose root is the node's
  local cd="${WORK_DIR}/kind-containerd" sock pid pair
  rm -rf "${cd}"
  mkdir -p "${cd}"
  sock="${cd}/containerd.sock"
  printf 'version = 2\nroot = "%s"\nstate = "%s"\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "%s"\n[ttrpc]\n  address = "%s.ttrpc"\n' \
    "${dir}/var/lib/containerd" "${cd}/state" "${sock}" "${sock}" > "${cd}/config.toml"
  setsid "${BIN_DIR}/containerd" --config "${cd}/config.toml" > "${cd}/containerd.log" 2>&1 < /dev/null &
  pid=$!
  for _ in $(seq 1 100); do [[ -S "${sock}" ]] && break; sleep 0.1; done
  [[ -S "${sock}" ]] || { tail -n 20 "${cd}/containerd.log" >&2; kill "${pid}"; die "the private containerd did not start"; }
  local c=("${BIN_DIR}/ctr" --address "${sock}" -n k8s.io)
  local srcs=()
  for pair in "${IMAGES[@]}"; do srcs+=("${pair%%=*}"); done
  if ! docker save "${srcs[@]}" | "${c[@]}" images import --label io.cri-containerd.pinned=pinned --all-platforms \
      --no-unpack - >&2; then
    kill "${pid}"; die "ctr import into the node image failed"
  fi
  full() { local first="${1%%/*}"; if [[ "$1" == */* && ( "${first}" == *.* || "${first}" == *:* ) ]]; then echo "$1"; else echo "docker.io/$1"; fi; }
  local src dst
  for pair in "${IMAGES[@]}"; do
    src="$(full "${pair%%=*}")" dst="$(full "${pair#*=}")"
    if [[ "${src}" != "${dst}" ]]; then
      "${c[@]}" images tag --force "${src}" "${dst}" >&2
      "${c[@]}" images rm "${src}" >/dev/null
    fi
    "${c[@]}" images label "${dst}" io.cri-containerd.pinned=pinned >/dev/null
  done
  "${c[@]}" images ls -q >&2
  kill "${pid}"
  wait "${pid}" 2>/dev/null || true
  rm -rf "${cd}"
  tar --numeric-owner --xattrs -C "${dir}" -c . \
    | docker import --change 'ENV container=docker' --change 'ENTRYPOINT ["/usr/local/bin/entrypoint","/sbin/init"]' \
        --change "LABEL ${LABEL}=${NODE_INPUTS}" --message "kind node ${KUBE_VERSION}, built offline" - "${NODE_IMAGE}" >&2
  rm -rf "${dir}"
  log "node image ${NODE_IMAGE}: built in $((SECONDS - start))s, $(docker image inspect -f '{{.Size}}' "${NODE_IMAGE}" | numfmt --to=iec)"
}
ids=""
for pair in "${IMAGES[@]}"; do ids+="$(docker image inspect -f '{{.Id}}' "${pair%%=*}") ${pair}"$'\n'; done
NODE_INPUTS="$(cat <(printf '%s' "${ids}") <(basename "${ROOTFS_TAR}") <(tar -C "${KIND_SRC}/images/base" -c files | sha) \
  "${HACK_DIR}/kind/default-cni.yaml" "${HACK_DIR}/kind/containerd-cni.json" \
  <(for b in kubelet kubectl kubeadm containerd ctr containerd-shim-runc-v2 runc; do sha256sum < "${BIN_DIR}/${b}"; done) \
  <(sha256sum < "${KIND_DIR}/bin/crictl") <(sha256sum < "${CRIU_BIN}") <(declare -f build_node) <(echo "${RESTRICT_OOM}") | sha)"

if current "${NODE_IMAGE}" "${NODE_INPUTS}"; then
  log "node image ${NODE_IMAGE} is current (inputs ${NODE_INPUTS})"
else
  build_node
fi
echo "KIND=${KIND_DIR}/bin/kind"
echo "KIND_NODE_IMAGE=${NODE_IMAGE}"
