#!/usr/bin/env bash
# Build (or reuse) Helm from its Go module (helm.sh/helm/v3/cmd/helm, pinned by hack/tools/helm/go.mod: the version
# is the one that go.mod requires; to move it: cd hack/tools/helm && go get helm.sh/helm/v3@vX.Y.Z && go mod tidy)
# into ${QOS_CACHE:-~/.cache/kube-qos-extender}/<KUBE_VERSION>/bin/helm, with the same Go module and build caches
# as hack/build-tools.sh, and print that path on stdout (last line; progress on stderr). Idempotent: reused when
# present with a matching stamp (.helm.version). The unit tests lint and render charts/kube-qos-extender with it
# (tests/test_chart.py), so `make unit` builds it first; a missing helm fails those tests, never skips them.
#
# Options:
#   --force    rebuild even if present
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

command -v go >/dev/null || die "go is required (go >= 1.25)"
export GOMODCACHE="${QOS_CACHE}/go/mod"
export GOCACHE="${QOS_CACHE}/go/build"
export GOTOOLCHAIN=local
export GOFLAGS="-buildvcs=false -mod=readonly"
export CGO_ENABLED=0
mkdir -p "${BIN_DIR}" "${GOMODCACHE}" "${GOCACHE}"

DIR="${HACK_DIR}/tools/helm"
HELM_VERSION="$(awk '$1 == "require" && $2 == "helm.sh/helm/v3" {print $3}' "${DIR}/go.mod")"
[[ "${HELM_VERSION}" == v3.* ]] || die "hack/tools/helm/go.mod has no 'require helm.sh/helm/v3 v3.x.y' line"

stamp="${BIN_DIR}/.helm.version"
if [[ "${FORCE}" == 0 && -x "${BIN_DIR}/helm" && "$(cat "${stamp}" 2>/dev/null)" == "${HELM_VERSION}+k8s" ]]; then
  log "helm: ${HELM_VERSION} present, skipping build"
else
  log "helm: building helm.sh/helm/v3/cmd/helm ${HELM_VERSION}"
  start=${SECONDS}
  # What Helm's Makefile injects: the version `helm version` reports, and the Kubernetes version `helm template`
  # and `helm lint` assume (1.<client-go minor>; without it a chart's kubeVersion is checked against v1.20).
  local_k8s="$(cd "${DIR}" && go list -f '{{.Version}}' -m k8s.io/client-go)"  # v0.<minor>.<patch>
  k8s_minor="$(echo "${local_k8s}" | cut -d. -f2)"
  flags="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    flags+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${k8s_minor}"
  done
  (cd "${DIR}" && nice -n 10 go build -trimpath -ldflags "${flags}" -o "${BIN_DIR}/.helm.tmp" helm.sh/helm/v3/cmd/helm)
  mv -f "${BIN_DIR}/.helm.tmp" "${BIN_DIR}/helm"
  echo "${HELM_VERSION}+k8s" > "${stamp}"  # +k8s: built with the Kubernetes version injected
  log "helm: built in $((SECONDS - start))s"
fi
echo "${BIN_DIR}/helm"
