# shellcheck shell=bash source-path=SCRIPTDIR
# Common helpers for hack/*.sh. Source it; it sets HACK_DIR, REPO_ROOT, loads versions.env and the cache paths.

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${HACK_DIR}/.." && pwd)"
export HACK_DIR REPO_ROOT

# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"

QOS_CACHE="${QOS_CACHE:-${HOME}/.cache/kube-qos-extender}"
BIN_DIR="${QOS_CACHE}/${KUBE_VERSION}/bin"
SHARE_DIR="${QOS_CACHE}/${KUBE_VERSION}/share"
export QOS_CACHE BIN_DIR SHARE_DIR

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

# Run apt-get install without letting package maintainer scripts start daemons
# (etcd-server / prometheus would otherwise start system services bound to default addresses).
apt_install_no_start() {
  local created_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    created_policy=1
  fi
  local rc=0
  if ! apt-cache policy "$@" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    apt-get update -qq >&2 || true
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 || rc=$?
  if [[ "${created_policy}" == 1 ]]; then
    rm -f /usr/sbin/policy-rc.d
  fi
  return "${rc}"
}
