#!/usr/bin/env bash
# Build the container images locally, without any registry, and save each as ${QOS_CACHE}/images/<short>.tar:
#   python          qos-local/python:3.11-bookworm   debootstrap --variant=minbase bookworm + python3, python3-venv,
#                                                    ca-certificates (+ bookworm-security/-updates), docker import
#   pause           registry.k8s.io/pause:3.10       static build/pause/linux/pause.c of k8s.io/kubernetes ${KUBE_VERSION}
#                                                    (also tagged with the source's own tag, 3.10.1)
#   busybox         qos-local/busybox:<version>      Debian bookworm's busybox-static (+ `busybox --install -s`)
#   kube-scheduler  registry.k8s.io/kube-scheduler:${KUBE_VERSION}   ${BIN_DIR}/kube-scheduler (hack/build-tools.sh)
#   kube-qos-extender  kube-qos-extender:dev         `docker build` of the repo's Dockerfile on the python image;
#                                                    the dependencies' wheels are fetched by the host's pip into the
#                                                    build context's wheelhouse/ (the build itself uses no index)
#
# A fresh Debian machine is enough: installs docker.io and debootstrap when missing (no daemon is started by
# apt), and starts its own containerd + dockerd when no engine answers `docker info`: data under
# ${QOS_CACHE}/docker, pid files and logs under ${QOS_CACHE}/dockerd, --iptables=false --ip-masq=false
# --bridge=none (the host's firewall and networks are never touched; builds and runs use --network host).
# The engine is left running for the tests; `hack/build-image.sh --stop-engine` stops what this script started.
#
# Idempotent: an image is rebuilt only when its inputs changed (stamp ${QOS_CACHE}/images/.<short>.inputs:
# a hash of the recipe and its input files); a missing image whose tar is current is `docker load`ed.
# The debootstrapped rootfs is cached (${QOS_CACHE}/image-build) so a rebuild does not debootstrap again.
# Prints KEY=VALUE lines on stdout (IMAGE_*, *_TAR, IMAGES_DIR); progress goes to stderr.
#
# Options: --force (rebuild every image; the cached rootfs is kept), --force-rootfs (debootstrap again too),
#          --stop-engine (stop the containerd/dockerd this script started, then exit)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FORCE=0 FORCE_ROOTFS=0 STOP=0
for arg in "$@"; do
  case "${arg}" in
    --force) FORCE=1 ;;
    --force-rootfs) FORCE=1 FORCE_ROOTFS=1 ;;
    --stop-engine) STOP=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) die "unknown argument: ${arg}" ;;
  esac
done

IMAGES_DIR="${QOS_CACHE}/images"
WORK_DIR="${QOS_CACHE}/image-build"
DOCKERD_DIR="${QOS_CACHE}/dockerd"
DOCKER_DATA_ROOT="${DOCKER_DATA_ROOT:-${QOS_CACHE}/docker}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://security.debian.org/debian-security}"
DEBIAN_SUITE=bookworm
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
ROOTFS_PACKAGES=python3,python3-venv,ca-certificates

IMAGE_PYTHON=qos-local/python:3.11-bookworm
IMAGE_PAUSE=registry.k8s.io/pause:3.10
IMAGE_SCHEDULER="registry.k8s.io/kube-scheduler:${KUBE_VERSION}"
IMAGE_EXTENDER=kube-qos-extender:dev
IMAGE_BUSYBOX=  # qos-local/busybox:<Debian's busybox-static upstream version>, set by build_busybox

sha() { sha256sum | cut -c1-16; }

# ------------------------------------------------------------------------------------------------ engine

engine_up() { docker info >/dev/null 2>&1; }

pid_alive() { # <pidfile> <exe basename>
  local pid
  pid="$(cat "$1" 2>/dev/null)" || return 1
  [[ -n "${pid}" && "$(readlink "/proc/${pid}/exe" 2>/dev/null)" == *"/$2" ]]
}

stop_engine() {
  local name pid
  for name in dockerd containerd; do
    if pid_alive "${DOCKERD_DIR}/${name}.pid" "${name}"; then
      pid="$(cat "${DOCKERD_DIR}/${name}.pid")"
      log "stopping ${name} (pid ${pid})"
      kill "${pid}"
      for _ in $(seq 1 100); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.2; done
    fi
  done
}

# The Debian packages this needs; apt starts no daemon (apt_install_no_start).
install_packages() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v docker >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v gcc >/dev/null || missing+=(gcc)
  [[ -f /usr/lib/x86_64-linux-gnu/libc.a || -n "$(find /usr/lib -name libc.a -print -quit 2>/dev/null)" ]] \
    || missing+=(libc6-dev)
  command -v curl >/dev/null || missing+=(curl)
  [[ -f "${KEYRING}" ]] || missing+=(debian-archive-keyring)
  if ((${#missing[@]})); then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    log "installing Debian packages: ${missing[*]}"
    apt_install_no_start "${missing[@]}"
  fi
}

# The docker client here may be newer than the daemon (e.g. /usr/local/bin/docker 28.x against Debian's
# dockerd 20.10, API 1.41). Docker negotiates down by itself; pin DOCKER_API_VERSION only if that fails.
negotiate_api() {
  docker version --format '{{.Server.APIVersion}}' >/dev/null 2>&1 && return 0
  local server
  server="$(curl -fsS --unix-socket /var/run/docker.sock http://localhost/version 2>/dev/null \
    | sed -n 's/.*"ApiVersion":"\([0-9.]*\)".*/\1/p')"
  [[ -n "${server}" ]] || return 1
  export DOCKER_API_VERSION="${server}"
  log "docker client and daemon do not negotiate: DOCKER_API_VERSION=${server}"
  docker version --format '{{.Server.APIVersion}}' >/dev/null 2>&1
}

start_engine() {
  mkdir -p "${DOCKERD_DIR}" "${DOCKER_DATA_ROOT}"
  # Our own containerd: dockerd adopts any containerd on /run/containerd/containerd.sock (e.g. one serving a
  # kubelet) instead of starting its own; this one has its own socket, state and root, and no CRI plugin.
  # The daemons do not inherit the lock (fd 9) of this script.
  local sock="${DOCKERD_DIR}/containerd.sock"
  if ! pid_alive "${DOCKERD_DIR}/containerd.pid" containerd; then
    cat > "${DOCKERD_DIR}/containerd.toml" <<EOF
version = 2
root = "${DOCKER_DATA_ROOT}/containerd/root"
state = "${DOCKERD_DIR}/containerd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "${sock}"
[ttrpc]
  address = "${sock}.ttrpc"
EOF
    log "starting containerd ($(command -v containerd); log ${DOCKERD_DIR}/containerd.log)"
    rm -f "${sock}"
    setsid containerd --config "${DOCKERD_DIR}/containerd.toml" \
      > "${DOCKERD_DIR}/containerd.log" 2>&1 < /dev/null 9>&- &
    echo $! > "${DOCKERD_DIR}/containerd.pid"
    for _ in $(seq 1 100); do [[ -S "${sock}" ]] && break; sleep 0.1; done
    [[ -S "${sock}" ]] || { tail -n 20 "${DOCKERD_DIR}/containerd.log" >&2; die "containerd did not start"; }
  fi
  if pid_alive "${DOCKERD_DIR}/dockerd.pid" dockerd; then
    log "dockerd $(cat "${DOCKERD_DIR}/dockerd.pid") is running but does not answer yet; waiting"
  else
    log "starting dockerd ($(command -v dockerd); data ${DOCKER_DATA_ROOT}; log ${DOCKERD_DIR}/dockerd.log)"
    # QOS_DOCKERD_EXTRA_ARGS: hack/kind-up.sh's default OCI runtime, where privileged containers need one
    # shellcheck disable=SC2086
    setsid dockerd --data-root "${DOCKER_DATA_ROOT}" \
      --pidfile "${DOCKERD_DIR}/dockerd.pid" --containerd "${sock}" --host unix:///var/run/docker.sock \
      --iptables=false --ip-masq=false --bridge=none ${QOS_DOCKERD_EXTRA_ARGS:-} \
      > "${DOCKERD_DIR}/dockerd.log" 2>&1 < /dev/null 9>&- &
  fi
  local start=${SECONDS}
  until engine_up || negotiate_api; do
    if ((SECONDS - start > 60)); then
      tail -n 30 "${DOCKERD_DIR}/dockerd.log" >&2
      die "dockerd did not answer \`docker info\` within 60 s (log: ${DOCKERD_DIR}/dockerd.log)"
    fi
    sleep 0.5
  done
  log "dockerd ready in $((SECONDS - start))s"
}

ensure_engine() {
  unset DOCKER_BUILDKIT
  if engine_up || negotiate_api; then
    log "docker engine: $(docker version --format 'client {{.Client.Version}}, server {{.Server.Version}} (API {{.Server.APIVersion}})')"
    return 0
  fi
  if [[ -n "${DOCKER_HOST:-}" && "${DOCKER_HOST}" != unix:///var/run/docker.sock ]]; then
    die "DOCKER_HOST=${DOCKER_HOST} does not answer \`docker info\`"
  fi
  start_engine
  log "docker engine: $(docker version --format 'client {{.Client.Version}}, server {{.Server.Version}} (API {{.Server.APIVersion}})')"
}

# ------------------------------------------------------------------------------------------------ stamps

image_current() { # <short> <image> <inputs hash>: true if saved for these inputs and the engine has that image
  local tar="${IMAGES_DIR}/$1.tar" stamp saved_inputs saved_id
  stamp="$(cat "${IMAGES_DIR}/.$1.inputs" 2>/dev/null || true)"
  read -r saved_inputs saved_id <<< "${stamp}"
  [[ "${FORCE}" == 0 && -s "${tar}" && "${saved_inputs}" == "$3" ]] || return 1
  # The engine may hold another build under the same tag (another QOS_CACHE, a manual build): load ours.
  if [[ "$(docker image inspect -f '{{.Id}}' "$2" 2>/dev/null)" != "${saved_id}" ]]; then
    log "$1: loading ${tar} into the engine"
    docker load -i "${tar}" >&2 || return 1
    echo "$3 $(docker image inspect -f '{{.Id}}' "$2")" > "${IMAGES_DIR}/.$1.inputs"
  fi
  log "$1: $2 is current (inputs $3)"
}

save_image() { # <short> <inputs hash> <seconds> <image>...
  local short="$1" inputs="$2" seconds="$3" id
  shift 3
  docker save -o "${IMAGES_DIR}/${short}.tar.tmp" "$@"
  mv -f "${IMAGES_DIR}/${short}.tar.tmp" "${IMAGES_DIR}/${short}.tar"
  id="$(docker image inspect -f '{{.Id}}' "$1")"
  echo "${inputs} ${id}" > "${IMAGES_DIR}/.${short}.inputs"
  printf '%s %s %ss %s\n' "$(date -u +%FT%TZ)" "${short}" "${seconds}" \
    "$(docker image inspect -f '{{.Size}}' "$1")" >> "${IMAGES_DIR}/build-times.log"
  log "${short}: $* built in ${seconds}s, $(du -h "${IMAGES_DIR}/${short}.tar" | cut -f1) saved to ${IMAGES_DIR}/${short}.tar"
}

# ------------------------------------------------------------------------------------------------ python

make_rootfs() { # <rootfs tar> : debootstrap minbase + python3, cleaned
  local dir="${WORK_DIR}/rootfs-python"
  rm -rf "${dir}"
  mkdir -p "${dir}"
  local start=${SECONDS}
  log "python: debootstrap --variant=minbase ${DEBIAN_SUITE} (+ ${ROOTFS_PACKAGES}) from ${DEBIAN_MIRROR}"
  debootstrap --variant=minbase --keyring="${KEYRING}" --include="${ROOTFS_PACKAGES}" \
    "${DEBIAN_SUITE}" "${dir}" "${DEBIAN_MIRROR}" > "${WORK_DIR}/debootstrap.log" 2>&1 \
    || { tail -n 30 "${WORK_DIR}/debootstrap.log" >&2; die "debootstrap failed (log: ${WORK_DIR}/debootstrap.log)"; }
  log "python: debootstrap done in $((SECONDS - start))s; applying ${DEBIAN_SUITE}-security and -updates"
  cat > "${dir}/etc/apt/sources.list" <<EOF
deb ${DEBIAN_MIRROR} ${DEBIAN_SUITE} main
deb ${DEBIAN_MIRROR} ${DEBIAN_SUITE}-updates main
deb ${DEBIAN_SECURITY_MIRROR} ${DEBIAN_SUITE}-security main
EOF
  printf '#!/bin/sh\nexit 101\n' > "${dir}/usr/sbin/policy-rc.d"
  chmod +x "${dir}/usr/sbin/policy-rc.d"
  { chroot "${dir}" apt-get -qq update && DEBIAN_FRONTEND=noninteractive chroot "${dir}" apt-get -qq -y upgrade; } \
    >> "${WORK_DIR}/debootstrap.log" 2>&1 \
    || { tail -n 30 "${WORK_DIR}/debootstrap.log" >&2; die "apt-get upgrade in the rootfs failed"; }
  chroot "${dir}" apt-get -qq clean
  rm -f "${dir}/usr/sbin/policy-rc.d"
  local version
  version="$(chroot "${dir}" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  [[ "${version}" == 3.11 ]] || die "the ${DEBIAN_SUITE} rootfs has python ${version}, not 3.11"
  chroot "${dir}" python3 -c 'import venv, ensurepip' || die "python3-venv is not usable in the rootfs"
  # What an image does not need: package lists and caches, docs, man pages, logs, device nodes.
  rm -rf "${dir:?}"/var/lib/apt/lists/* "${dir:?}"/var/cache/apt/* "${dir:?}"/var/cache/debconf/*-old \
    "${dir:?}"/usr/share/doc/* "${dir:?}"/usr/share/man/* "${dir:?}"/usr/share/info/* "${dir:?}"/usr/share/locale/* \
    "${dir:?}"/var/log/* "${dir:?}"/tmp/* "${dir:?}"/dev/* "${dir:?}"/proc/* "${dir:?}"/sys/* "${dir:?}"/root/.cache
  find "${dir}/usr/lib" -name __pycache__ -prune -exec rm -rf {} +
  tar --numeric-owner --xattrs -C "${dir}" -cf "$1.tmp" .
  mv -f "$1.tmp" "$1"
  rm -rf "${dir}"
  log "python: rootfs $(du -h "$1" | cut -f1) in $((SECONDS - start))s total -> $1"
}

build_python() {
  local key rootfs inputs
  key="$(printf '%s\n' "${DEBIAN_SUITE}" "${ROOTFS_PACKAGES}" "$(declare -f make_rootfs)" | sha)"
  rootfs="${WORK_DIR}/python-${DEBIAN_SUITE}-${key}.tar"
  inputs="$(printf '%s\n' "${key}" "$(declare -f build_python)" | sha)"
  image_current python "${IMAGE_PYTHON}" "${inputs}" && return 0
  local start=${SECONDS}
  if [[ "${FORCE_ROOTFS}" == 1 || ! -s "${rootfs}" ]]; then
    make_rootfs "${rootfs}"
  else
    log "python: reusing the cached rootfs ${rootfs}"
  fi
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "debootstrap --variant=minbase ${DEBIAN_SUITE} + ${ROOTFS_PACKAGES}" \
    "${rootfs}" "${IMAGE_PYTHON}" >&2
  save_image python "${inputs}" $((SECONDS - start)) "${IMAGE_PYTHON}"
}

# ------------------------------------------------------------------------------------------------ pause

kubernetes_module_dir() {
  local dir="${QOS_CACHE}/go/mod/k8s.io/kubernetes@${KUBE_VERSION}"
  if [[ ! -d "${dir}" ]]; then  # not downloaded yet: fetch just that module (read-only for hack/tools)
    command -v go >/dev/null || die "go is needed to download k8s.io/kubernetes@${KUBE_VERSION} (pause.c)"
    local tmp
    tmp="$(mktemp -d)"
    dir="$(cd "${tmp}" && GOMODCACHE="${QOS_CACHE}/go/mod" GOFLAGS=-mod=mod GOTOOLCHAIN=local \
      go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    rm -rf "${tmp}"
  fi
  [[ -f "${dir}/build/pause/linux/pause.c" ]] || die "build/pause/linux/pause.c not found in ${dir}"
  echo "${dir}"
}

build_pause() {
  local src tag inputs
  src="$(kubernetes_module_dir)/build/pause"
  tag="$(sed -n 's/^TAG ?= *//p' "${src}/Makefile")"  # 3.10.1 in v1.35
  inputs="$(cat "${src}/linux/pause.c" <(echo "${tag}") <(gcc --version | head -n1) <(declare -f build_pause) | sha)"
  image_current pause "${IMAGE_PAUSE}" "${inputs}" && return 0
  local start=${SECONDS} dir="${WORK_DIR}/rootfs-pause"
  rm -rf "${dir}"
  mkdir -p "${dir}"
  # upstream: CFLAGS = -Os -Wall -Werror -static -DVERSION=v$(TAG)-$(REV), built in kube-cross
  gcc -Os -Wall -Werror -static -DVERSION="v${tag}-${KUBE_VERSION}" -o "${dir}/pause" "${src}/linux/pause.c"
  strip "${dir}/pause"
  "${dir}/pause" -v >&2
  if readelf -lW "${dir}/pause" | grep -q INTERP; then die "pause is not static"; fi
  tar --numeric-owner --owner=0 --group=0 -C "${dir}" -c pause \
    | docker import --change 'USER 65535:65535' --change 'ENTRYPOINT ["/pause"]' \
        --message "pause.c of k8s.io/kubernetes ${KUBE_VERSION} (v${tag})" - "${IMAGE_PAUSE}" >&2
  docker tag "${IMAGE_PAUSE}" "registry.k8s.io/pause:${tag}"
  rm -rf "${dir}"
  save_image pause "${inputs}" $((SECONDS - start)) "${IMAGE_PAUSE}" "registry.k8s.io/pause:${tag}"
}

# ------------------------------------------------------------------------------------------------ busybox

build_busybox() {
  local debs="${WORK_DIR}/debs" deb version
  mkdir -p "${debs}"
  deb="$(find "${debs}" -name 'busybox-static_*.deb' -print -quit)"
  if [[ -z "${deb}" ]]; then  # downloaded, not installed: the host's busybox stays as it is
    apt-cache policy busybox-static 2>/dev/null | grep -q 'Candidate: [0-9]' || apt-get update -qq >&2
    (cd "${debs}" && apt-get -qq -o APT::Sandbox::User=root download busybox-static >&2)
    deb="$(find "${debs}" -name 'busybox-static_*.deb' -print -quit)"
    [[ -n "${deb}" ]] || die "could not download busybox-static"
  fi
  version="$(dpkg-deb -f "${deb}" Version)"  # 1:1.35.0-4+deb12u1+b1 -> 1.35.0
  version="${version#*:}"
  version="${version%%-*}"
  IMAGE_BUSYBOX="qos-local/busybox:${version}"
  local inputs
  inputs="$(cat "${deb}" <(declare -f build_busybox) | sha)"
  image_current busybox "${IMAGE_BUSYBOX}" "${inputs}" && return 0
  local start=${SECONDS} dir="${WORK_DIR}/rootfs-busybox" x="${WORK_DIR}/busybox-deb"
  rm -rf "${dir}" "${x}"
  mkdir -p "${dir}"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,root,home} "${x}"
  dpkg-deb -x "${deb}" "${x}"
  install -m 0755 "${x}/bin/busybox" "${dir}/bin/busybox"
  chroot "${dir}" /bin/busybox --install -s
  chmod 1777 "${dir}/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "${dir}/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' > "${dir}/etc/group"
  tar --numeric-owner --owner=0 --group=0 -C "${dir}" -c . \
    | docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["sh"]' --message "Debian ${DEBIAN_SUITE} $(basename "${deb}")" - "${IMAGE_BUSYBOX}" >&2
  rm -rf "${dir}" "${x}"
  save_image busybox "${inputs}" $((SECONDS - start)) "${IMAGE_BUSYBOX}"
}

# ------------------------------------------------------------------------------------------------ kube-scheduler

wait_for_scheduler_binary() {
  local bin="${BIN_DIR}/kube-scheduler" stamp="${BIN_DIR}/.kube-scheduler.version"
  scheduler_ready() { [[ -x "${bin}" && "$(cat "${stamp}" 2>/dev/null)" == "${KUBE_VERSION}" ]]; }
  scheduler_ready && return 0
  local waited=0
  while pgrep -f 'hack/build-tools.sh|build-tools.sh' >/dev/null; do
    scheduler_ready && return 0
    ((waited % 60 == 0)) && log "kube-scheduler: waiting for the running hack/build-tools.sh ($(pgrep -f build-tools.sh | head -n1))"
    sleep 5
    waited=$((waited + 5))
  done
  scheduler_ready && return 0
  log "kube-scheduler: ${bin} missing, running hack/build-tools.sh"
  "${HACK_DIR}/build-tools.sh" >&2
  scheduler_ready || die "hack/build-tools.sh did not produce ${bin}"
}

build_scheduler() {
  wait_for_scheduler_binary
  local bin="${BIN_DIR}/kube-scheduler" inputs
  inputs="$(cat "${bin}" <(declare -f build_scheduler) | sha)"
  image_current kube-scheduler "${IMAGE_SCHEDULER}" "${inputs}" && return 0
  if readelf -lW "${bin}" | grep -q INTERP; then
    die "${bin} is dynamically linked (CGO_ENABLED must be 0 in hack/build-tools.sh); it cannot run from scratch"
  fi
  local start=${SECONDS} dir="${WORK_DIR}/rootfs-kube-scheduler"
  rm -rf "${dir}"
  mkdir -p "${dir}/usr/local/bin" "${dir}/tmp" "${dir}/etc"
  install -m 0755 "${bin}" "${dir}/usr/local/bin/kube-scheduler"
  chmod 1777 "${dir}/tmp"
  printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' > "${dir}/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "${dir}/etc/group"
  tar --numeric-owner --owner=0 --group=0 -C "${dir}" -c . \
    | docker import --change 'ENV PATH=/usr/local/bin' --change 'USER 65532:65532' \
        --change 'ENTRYPOINT ["/usr/local/bin/kube-scheduler"]' \
        --message "kube-scheduler ${KUBE_VERSION} from hack/build-tools.sh" - "${IMAGE_SCHEDULER}" >&2
  rm -rf "${dir}"
  docker run --rm --network host "${IMAGE_SCHEDULER}" --version >&2
  save_image kube-scheduler "${inputs}" $((SECONDS - start)) "${IMAGE_SCHEDULER}"
}

# ------------------------------------------------------------------------------------------------ extender

pip_cmd() { # the host's pip: the repo's venv (make venv), else python3 -m pip
  if [[ -x "${REPO_ROOT}/.venv/bin/pip" ]]; then
    "${REPO_ROOT}/.venv/bin/pip" "$@"
  elif python3 -m pip --version >/dev/null 2>&1; then
    python3 -m pip "$@"
  else
    die "pip is needed to fetch the wheels for the image: run \`make venv\` first"
  fi
}

# The wheels of the pinned dependencies and build requirements for the python image's interpreter and glibc,
# fetched by the host's pip (its CA trust, proxy settings and cache apply; TLS-intercepting proxies work), so
# that `docker build` needs no index. A requirement without a compatible wheel fails here, not in the build
# (the image has no compiler).
fill_wheelhouse() { # <dir>; prints its key
  local target arch glibc pyver reqs key
  target="$(docker run --rm --network none "${IMAGE_PYTHON}" python3 -c \
    'import platform, sys; print(platform.machine(), platform.libc_ver()[1], "%d.%d" % sys.version_info[:2])')"
  read -r arch glibc pyver <<< "${target}"
  # the locked dependencies (with hashes) and, apart (pip's hash mode is all or nothing), the build requirements
  reqs="$(python3 -c 'import sys, tomllib; d = tomllib.load(open(sys.argv[1], "rb"))
print("\n".join(d["build-system"]["requires"]))' "${REPO_ROOT}/pyproject.toml")"
  key="$(printf '%s\n' "${target}" "${reqs}" | cat - "${REPO_ROOT}/requirements.lock" | sha)"
  if [[ "$(cat "$1/.key" 2>/dev/null)" == "${key}" && "${FORCE}" == 0 ]]; then
    echo "${key}"
    return 0
  fi
  local platforms=() i start=${SECONDS}
  for ((i = ${glibc#2.}; i >= 17; i--)); do platforms+=(--platform "manylinux_2_${i}_${arch}"); done
  platforms+=(--platform "manylinux2014_${arch}" --platform "manylinux2010_${arch}" --platform "manylinux1_${arch}")
  rm -rf "$1"
  mkdir -p "$1"
  log "kube-qos-extender: fetching wheels for CPython ${pyver} / glibc ${glibc} / ${arch} into $1"
  printf '%s\n' "${reqs}" > "$1/.requirements.txt"
  local req
  for req in "${REPO_ROOT}/requirements.lock" "$1/.requirements.txt"; do
    pip_cmd download -q --disable-pip-version-check --only-binary=:all: --python-version "${pyver}" \
      --implementation cp --abi "cp${pyver/./}" --abi abi3 --abi none "${platforms[@]}" \
      -d "$1" -r "${req}" >&2
  done
  echo "${key}" > "$1/.key"
  log "kube-qos-extender: $(find "$1" -name '*.whl' | wc -l) wheels, $(du -sh "$1" | cut -f1) in $((SECONDS - start))s"
  echo "${key}"
}

build_extender() {
  local ctx="${WORK_DIR}/extender-context" wheels_key base_id inputs
  mkdir -p "${ctx}"
  wheels_key="$(fill_wheelhouse "${ctx}/wheelhouse")"
  base_id="$(docker image inspect -f '{{.Id}}' "${IMAGE_PYTHON}")"
  local files=(Dockerfile .dockerignore pyproject.toml setup.py requirements.lock README.md extender)
  inputs="$(cd "${REPO_ROOT}" && {
    echo "${base_id} ${wheels_key}"
    declare -f build_extender
    find "${files[@]}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' ! -name '*_pb2*' -print0 | sort -z \
      | xargs -0 sha256sum
  } | sha)"
  image_current kube-qos-extender "${IMAGE_EXTENDER}" "${inputs}" && return 0
  # The build context: a copy of what .dockerignore lets through, plus the wheelhouse.
  find "${ctx}" -mindepth 1 -maxdepth 1 ! -name wheelhouse -exec rm -rf {} +
  # without the stubs an editable install generated in the source tree: the image build generates its own
  (cd "${REPO_ROOT}" && tar -c --exclude=__pycache__ --exclude='*.pyc' --exclude='*_pb2*' "${files[@]}") \
    | tar -x -C "${ctx}"
  local start=${SECONDS}
  log "kube-qos-extender: docker build (classic builder) on ${IMAGE_PYTHON}; log ${WORK_DIR}/extender-build.log"
  # Classic builder: Debian's dockerd 20.10 has no buildx, and BuildKit would fetch its frontend from a registry.
  # The build stage is tagged (${IMAGE_EXTENDER%%:*}:build-cache) so that its layers, the next build's cache,
  # are not untagged leftovers: those of earlier builds are pruned below.
  local log="${WORK_DIR}/extender-build.log" target
  : > "${log}"
  for target in build runtime; do
    DOCKER_BUILDKIT=0 docker build --force-rm --network host --build-arg PYTHON_IMAGE="${IMAGE_PYTHON}" --target "${target}" \
      -t "$([[ "${target}" == build ]] && echo "${IMAGE_EXTENDER%%:*}:build-cache" || echo "${IMAGE_EXTENDER}")" \
      "${ctx}" >> "${log}" 2>&1 \
      || { tail -n 40 "${log}" >&2; die "docker build --target ${target} failed (log: ${log})"; }
  done
  save_image kube-qos-extender "${inputs}" $((SECONDS - start)) "${IMAGE_EXTENDER}"
  # Earlier builds, now untagged: runtime images (each a copy of the venv) and build stages (labelled).
  docker image prune -f --filter "label=org.opencontainers.image.title=kube-qos-extender" >&2
  docker image prune -f --filter "label=io.kube-qos-extender.stage=build" >&2
}

# ------------------------------------------------------------------------------------------------ main

if [[ "${STOP}" == 1 ]]; then
  stop_engine
  exit 0
fi

[[ "$(id -u)" == 0 ]] || die "needs root (apt, debootstrap, chroot, dockerd)"
total_start=${SECONDS}
mkdir -p "${IMAGES_DIR}" "${WORK_DIR}"
# One run at a time (they share the build context, the rootfs and the tars); a second run waits, then finds
# everything current.
exec 9> "${IMAGES_DIR}/.lock"
if ! flock -n 9; then
  log "another hack/build-image.sh is running; waiting for it"
  flock 9
fi
install_packages
ensure_engine
build_python
build_busybox
build_pause
build_extender
build_scheduler
log "images ready in $((SECONDS - total_start))s:"
docker images --format '  {{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' \
  "${IMAGE_EXTENDER%%:*}" >&2
for image in "${IMAGE_PYTHON}" "${IMAGE_PAUSE}" "${IMAGE_BUSYBOX}" "${IMAGE_SCHEDULER}"; do
  docker images --format '  {{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' "${image}" >&2
done

cat <<EOF
IMAGE_EXTENDER=${IMAGE_EXTENDER}
IMAGE_SCHEDULER=${IMAGE_SCHEDULER}
IMAGE_PAUSE=${IMAGE_PAUSE}
IMAGE_BUSYBOX=${IMAGE_BUSYBOX}
IMAGE_PYTHON=${IMAGE_PYTHON}
IMAGES_DIR=${IMAGES_DIR}
IMAGE_EXTENDER_TAR=${IMAGES_DIR}/kube-qos-extender.tar
IMAGE_SCHEDULER_TAR=${IMAGES_DIR}/kube-scheduler.tar
IMAGE_PAUSE_TAR=${IMAGES_DIR}/pause.tar
IMAGE_BUSYBOX_TAR=${IMAGES_DIR}/busybox.tar
IMAGE_PYTHON_TAR=${IMAGES_DIR}/python.tar
EOF
if [[ -n "${DOCKER_API_VERSION:-}" ]]; then echo "DOCKER_API_VERSION=${DOCKER_API_VERSION}"; fi
