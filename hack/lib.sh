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
  # every package needs a candidate, not just one of them (a partly stale index would skip the update)
  if (($(apt-cache policy "$@" 2>/dev/null | grep -c 'Candidate: [0-9]') < $#)); then
    apt-get update -qq >&2 || true
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 || rc=$?
  if [[ "${created_policy}" == 1 ]]; then
    rm -f /usr/sbin/policy-rc.d
  fi
  return "${rc}"
}

# sign_cert <CA base> <out base> <subject> <extendedKeyUsage> [subjectAltName]: <out base>.key (made when absent,
# mode 600) and <out base>.crt signed by <CA base>.crt/.key for a year; a random serial, so no serial file is
# written beside the CA. The one certificate recipe of local-up.sh, real-nodes.sh and deploy-local.sh.
sign_cert() {
  local ca="$1" out="$2" subj="$3" eku="$4" san="${5:-}"
  [[ -s "${out}.key" ]] || openssl genrsa -out "${out}.key" 2048 2>/dev/null
  chmod 600 "${out}.key"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=${eku}"
    if [[ -n "${san}" ]]; then echo "subjectAltName=${san}"; fi
  } > "${out}.ext"
  openssl req -new -key "${out}.key" -subj "${subj}" -out "${out}.csr" 2>/dev/null
  openssl x509 -req -in "${out}.csr" -CA "${ca}.crt" -CAkey "${ca}.key" -set_serial "0x$(openssl rand -hex 16)" \
    -days 365 -sha256 -extfile "${out}.ext" -out "${out}.crt" 2>/dev/null
  rm -f "${out}.csr" "${out}.ext"
}

# make_ca <out base> <common name>: a self-signed CA (<out base>.key, <out base>.crt, ten years).
make_ca() {
  openssl genrsa -out "$1.key" 2048 2>/dev/null
  chmod 600 "$1.key"
  openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$1.crt" 2>/dev/null
}

# kubeconfig <server URL> <CA file> <user> <cert base>: a kubeconfig with a client certificate (<cert base>.crt,
# .key) on stdout. The one recipe of local-up.sh (components on 127.0.0.1) and real-nodes.sh (kubelets,
# kube-proxy through the relay).
kubeconfig() {
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: qos-local
  cluster:
    server: $1
    certificate-authority: $2
users:
- name: $3
  user:
    client-certificate: $4.crt
    client-key: $4.key
contexts:
- name: qos-local
  context:
    cluster: qos-local
    user: $3
current-context: qos-local
EOF
}
