#!/usr/bin/env bash
# Build CRIU ${CRIU_VERSION} (hack/versions.env) from Debian ${CRIU_DEBIAN_SUITE}'s orig source tarball on
# Debian bookworm, cache it as ${QOS_CACHE}/criu-<version>/criu and run `criu check`.
#
# Why: bookworm's criu 3.17 fails on kernels >= 6.13 ("vdso: Unexpected rt vDSO area bounds", fixed in
# CRIU 4.1); trixie's binary package needs a newer libc, but its source builds on bookworm.
# /etc/apt is untouched: the trixie deb-src entry lives in a private apt configuration under the cache.
# Idempotent: an existing binary is reused (only `criu check` runs). Prints the binary path on stdout.
#
# Options: --force (rebuild), --no-check (skip `criu check`, e.g. in an unprivileged container)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FORCE=0 CHECK=1
for arg in "$@"; do
  case "${arg}" in
    --force) FORCE=1 ;;
    --no-check) CHECK=0 ;;
    -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) die "unknown argument: ${arg}" ;;
  esac
done

CRIU_DIR="${QOS_CACHE}/criu-${CRIU_VERSION}"
CRIU_BIN="${CRIU_DIR}/criu"
APT_DIR="${QOS_CACHE}/apt-${CRIU_DEBIAN_SUITE}-src"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
BUILD_DEPS=(build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
            libnl-3-dev libnet1-dev libcap-dev uuid-dev libbsd-dev libgnutls28-dev xz-utils)

private_apt() {
  apt-get -q \
    -o Dir::Etc::sourcelist="${APT_DIR}/sources.list" \
    -o Dir::Etc::sourceparts="${APT_DIR}/sources.list.d" \
    -o Dir::Etc::preferences="${APT_DIR}/preferences" \
    -o Dir::Etc::preferencesparts="${APT_DIR}/preferences.d" \
    -o Dir::State::Lists="${APT_DIR}/lists" \
    -o Dir::Cache="${APT_DIR}/cache" \
    -o APT::Get::List-Cleanup=false \
    -o APT::Sandbox::User=root \
    "$@"
}

fetch_orig_tarball() { # prints the path of the verified tarball
  local tarball="${CRIU_DIR}/criu_${CRIU_VERSION}.orig.tar.xz"
  if [[ -s "${tarball}" ]]; then
    echo "${tarball}"
    return 0
  fi
  mkdir -p "${APT_DIR}/sources.list.d" "${APT_DIR}/preferences.d" "${APT_DIR}/lists/partial" \
           "${APT_DIR}/cache/archives/partial"
  : > "${APT_DIR}/preferences"
  echo "deb-src [signed-by=${KEYRING}] ${DEBIAN_MIRROR} ${CRIU_DEBIAN_SUITE} main" > "${APT_DIR}/sources.list"
  log "criu: reading ${CRIU_DEBIAN_SUITE} Sources index (private apt config in ${APT_DIR})"
  private_apt update >&2
  # 'URI' file size SHA256:hex  -- one line per file of the source package
  local uris line url file sha
  uris="$(private_apt --print-uris source criu)"
  line="$(grep -F "criu_${CRIU_VERSION}.orig.tar" <<< "${uris}" | head -n1 || true)"
  if [[ -z "${line}" ]]; then
    die "criu ${CRIU_VERSION} orig tarball not listed in ${CRIU_DEBIAN_SUITE} Sources; it lists:
$(grep -o "criu_[^ ]*orig[^ ]*" <<< "${uris}" | sort -u)
update CRIU_VERSION in hack/versions.env"
  fi
  url="$(awk '{gsub(/\x27/, "", $1); print $1}' <<< "${line}")"
  file="$(awk '{print $2}' <<< "${line}")"
  sha="$(grep -o 'SHA256:[0-9a-f]*' <<< "${line}" | cut -d: -f2)"
  [[ -n "${sha}" ]] || die "no SHA256 for ${file} in the Sources index"
  log "criu: downloading ${url}"
  curl -fsSL --retry 3 -o "${CRIU_DIR}/${file}.part" "${url}"
  echo "${sha}  ${CRIU_DIR}/${file}.part" | sha256sum -c --quiet - >&2 \
    || die "sha256 mismatch for ${file} (expected ${sha})"
  mv -f "${CRIU_DIR}/${file}.part" "${CRIU_DIR}/${file}"
  echo "${CRIU_DIR}/${file}"
}

build_criu() {
  mkdir -p "${CRIU_DIR}"
  local missing=() p
  for p in "${BUILD_DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q 'install ok installed' || missing+=("${p}")
  done
  if ((${#missing[@]})); then
    log "criu: installing build deps from the system's suite: ${missing[*]}"
    apt_install_no_start "${missing[@]}"
  fi
  local tarball src start=${SECONDS}
  tarball="$(fetch_orig_tarball)"
  src="${CRIU_DIR}/src"
  rm -rf "${src}"
  mkdir -p "${src}"
  tar -xf "${tarball}" -C "${src}" --strip-components=1
  log "criu: make -j$(nproc) criu in ${src}"
  make -C "${src}" -j"$(nproc)" criu > "${CRIU_DIR}/build.log" 2>&1 \
    || { tail -n 30 "${CRIU_DIR}/build.log" >&2; die "criu build failed (full log: ${CRIU_DIR}/build.log)"; }
  install -m 0755 "${src}/criu/criu" "${CRIU_BIN}.tmp"
  mv -f "${CRIU_BIN}.tmp" "${CRIU_BIN}"
  # criu-ns: restore into a fresh PID namespace (a restored process keeps its PID)
  if [[ -f "${src}/scripts/criu-ns" ]]; then install -m 0755 "${src}/scripts/criu-ns" "${CRIU_DIR}/criu-ns"; fi
  log "criu: built in $((SECONDS - start))s"
}

if [[ "${FORCE}" == 1 || ! -x "${CRIU_BIN}" ]]; then
  build_criu
else
  log "criu: ${CRIU_BIN} present, skipping build"
fi

"${CRIU_BIN}" --version >&2
if [[ "${CHECK}" == 1 ]]; then
  if ! out="$("${CRIU_BIN}" check 2>&1)"; then
    printf 'criu check FAILED:\n%s\n' "${out}" >&2
    exit 1
  fi
  log "criu check: ${out##*$'\n'}"
fi
echo "${CRIU_BIN}"
