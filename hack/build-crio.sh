#!/usr/bin/env bash
# Build CRI-O ${CRIO_VERSION} (hack/versions.env) for real nodes with QOS_NODE_RUNTIME=crio (hack/real-nodes.sh):
#   crio   from the github.com/cri-o/cri-o module (Go module proxy; `go install ...@version` is refused there:
#          the proxy answers 403 on the module's version list, so the module is downloaded and built in a copy)
#   pinns  CRI-O's namespace pinner (pinns/src/*.c, static, gcc)
# into ${BIN_DIR} (stamps .crio.version / .pinns.version), and installs Debian's conmon, skopeo and nftables (CRI-O's
# container monitor; image import into a node's containers/storage) when missing. runc and CRIU come from
# hack/build-tools.sh and hack/build-criu.sh, as for the containerd nodes.
# Idempotent: nothing is rebuilt when the binaries and their stamps match the pinned version.
#
# Options: --force (rebuild)
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

export GOMODCACHE="${QOS_CACHE}/go/mod" GOCACHE="${QOS_CACHE}/go/build" GOTOOLCHAIN=local
mkdir -p "${BIN_DIR}" "${GOMODCACHE}" "${GOCACHE}"

built() { # <name>
  [[ "${FORCE}" == 0 && -x "${BIN_DIR}/$1" && "$(cat "${BIN_DIR}/.$1.version" 2>/dev/null)" == "${CRIO_VERSION}" ]]
}

# conmon, skopeo: runtime dependencies; gcc, libseccomp-dev: the build (crio's `seccomp` tag needs cgo)
pkgs=()
command -v conmon >/dev/null || pkgs+=(conmon)
command -v skopeo >/dev/null || pkgs+=(skopeo)
# nft: CRI-O 1.34.0 wires a pod's hostPorts through nftables when its manager could be made, else iptables; without
# the nft binary the nftables manager is a typed nil that the fallback check misses, and the first pod with a
# hostPort (the node agent's 9443) panics crio (internal/hostport/meta_hostport_manager.go Add: nil pointer)
command -v nft >/dev/null || [[ -x /usr/sbin/nft ]] || pkgs+=(nftables)
if ! built crio || ! built pinns; then
  command -v go >/dev/null || die "go is required (go >= 1.24)"
  command -v gcc >/dev/null || pkgs+=(gcc libc6-dev)
  [[ -e /usr/include/seccomp.h ]] || pkgs+=(libseccomp-dev)
fi
if ((${#pkgs[@]})); then
  log "crio: installing ${pkgs[*]} (apt)"
  apt_install_no_start "${pkgs[@]}" || die "apt-get install ${pkgs[*]} failed"
fi

if built crio && built pinns; then
  echo "${BIN_DIR}"
  exit 0
fi

log "crio: downloading github.com/cri-o/cri-o@${CRIO_VERSION}"
src="$(cd "$(mktemp -d)" && GOFLAGS=-mod=mod go mod download -json "github.com/cri-o/cri-o@${CRIO_VERSION}" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -d "${src}" ]] || die "could not download github.com/cri-o/cri-o@${CRIO_VERSION}"
# the module cache is read-only: build in a writable copy (kept, keyed by version, for the Go build cache's sake)
work="${QOS_CACHE}/src/cri-o-${CRIO_VERSION}"
if [[ ! -f "${work}/go.mod" ]]; then
  rm -rf "${work}.tmp"
  mkdir -p "$(dirname "${work}")"
  cp -r "${src}" "${work}.tmp"
  chmod -R u+w "${work}.tmp"
  mv "${work}.tmp" "${work}"
fi

if ! built crio; then
  log "crio: building crio ${CRIO_VERSION} (a few minutes)"
  t0=${SECONDS}
  # the tags of CRI-O's Makefile for a build without btrfs/devicemapper/gpgme headers
  (cd "${work}" && CGO_ENABLED=1 GOFLAGS="-buildvcs=false -mod=mod" go build -trimpath \
    -tags "containers_image_openpgp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper seccomp" -ldflags "-s -w" \
    -o "${BIN_DIR}/crio.tmp" ./cmd/crio)
  mv -f "${BIN_DIR}/crio.tmp" "${BIN_DIR}/crio"
  echo "${CRIO_VERSION}" > "${BIN_DIR}/.crio.version"
  log "crio: built in $((SECONDS - t0))s"
fi

if ! built pinns; then
  log "crio: building pinns"
  make -s -C "${work}/pinns" clean >/dev/null
  make -s -C "${work}/pinns" >&2
  install -m 0755 "${work}/bin/pinns" "${BIN_DIR}/pinns"
  echo "${CRIO_VERSION}" > "${BIN_DIR}/.pinns.version"
fi

"${BIN_DIR}/crio" --version | head -n1 >&2
echo "${BIN_DIR}"
