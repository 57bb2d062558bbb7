#!/usr/bin/env bash
# Build (or reuse) the real cluster-autoscaler ${CA_VERSION} from its unmodified release source, twice:
#   cluster-autoscaler-kwok          -tags kwok          (--cloud-provider=kwok: the local stand-in for a cloud's
#                                                         node groups, nodes as kwok Node objects)
#   cluster-autoscaler-externalgrpc  -tags externalgrpc  (--cloud-provider=externalgrpc: our sidecar's node groups)
# into ${QOS_CACHE}/<KUBE_VERSION>/bin, and the ProvisioningRequest CRD of that release into .../share, and print
# the bin directory on stdout (last line). The source is ${CA_TARBALL} (default ../shared/vendor/
# cluster-autoscaler-${CA_VERSION}.tar.gz beside the repo): the Go module proxy does not serve CA releases.
# Idempotent (a stamp per binary: version + tarball sha256). ~5 min per binary cold on 2 cores.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -z "${CA_TARBALL:-}" ]]; then  # beside the checkout (../shared/vendor), else the workplace's shared folder
  for dir in "${REPO_ROOT}/../shared/vendor" /work/shared/vendor; do
    CA_TARBALL="${dir}/cluster-autoscaler-${CA_VERSION}.tar.gz"
    [[ -f "${CA_TARBALL}" ]] && break
  done
fi
STAMP="${CA_VERSION}-${CA_TARBALL_SHA256}"
CRD="${SHARE_DIR}/provisioningrequests.autoscaling.x-k8s.io.yaml"

fresh() { [[ -x "${BIN_DIR}/$1" && "$(cat "${BIN_DIR}/.$1.version" 2>/dev/null)" == "${STAMP}" ]]; }

if fresh cluster-autoscaler-kwok && fresh cluster-autoscaler-externalgrpc && [[ -s "${CRD}" ]]; then
  echo "${BIN_DIR}"
  exit 0
fi
[[ -f "${CA_TARBALL}" ]] || die "cluster-autoscaler source not found: ${CA_TARBALL} (set CA_TARBALL)"
echo "${CA_TARBALL_SHA256}  ${CA_TARBALL}" | sha256sum -c --quiet - || die "sha256 mismatch: ${CA_TARBALL}"
command -v go >/dev/null || die "go is required"

export GOMODCACHE="${QOS_CACHE}/go/mod" GOCACHE="${QOS_CACHE}/go/build" GOTOOLCHAIN=local
export GOFLAGS="-buildvcs=false -mod=mod" CGO_ENABLED=0
mkdir -p "${BIN_DIR}" "${SHARE_DIR}" "${GOMODCACHE}" "${GOCACHE}"
SRC="${QOS_CACHE}/src/cluster-autoscaler-${CA_VERSION}"
if [[ ! -f "${SRC}/.extracted" ]]; then
  rm -rf "${SRC}"
  mkdir -p "${SRC}"
  tar -xzf "${CA_TARBALL}" -C "${SRC}"
  touch "${SRC}/.extracted"
fi
MAIN_GO="$(find "${SRC}" -maxdepth 3 -name main.go -path '*cluster-autoscaler/main.go' | head -1)"
[[ -n "${MAIN_GO}" ]] || die "no cluster-autoscaler/main.go in ${CA_TARBALL}"
CA_DIR="$(dirname "${MAIN_GO}")"

for tag in kwok externalgrpc; do
  name="cluster-autoscaler-${tag}"
  fresh "${name}" && continue
  log "${name}: building cluster-autoscaler ${CA_VERSION} -tags ${tag}"
  (cd "${CA_DIR}" && go build -tags "${tag}" -ldflags "-s -w" -o "${BIN_DIR}/${name}.tmp" .)
  mv "${BIN_DIR}/${name}.tmp" "${BIN_DIR}/${name}"
  echo "${STAMP}" > "${BIN_DIR}/.${name}.version"
done
cp "$(find "${CA_DIR}" -path '*apis/config/crd/*provisioningrequests*.yaml' | head -1)" "${CRD}"
echo "${BIN_DIR}"
