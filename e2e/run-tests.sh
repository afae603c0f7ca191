#!/usr/bin/env bash
# Every test of knic, on a fresh Debian machine: installs what the tests need, then runs
#   1. `cargo test --workspace --locked` (unit, integration, fake-API e2e, host-kernel tests),
#   2. the kernel tests again in a Debian-kernel VM (VLAN, ipvlan, dummy for real), and the
#      SR-IOV, vfio-pci and RDMA trials on emulated hardware there (QEMU's igb NICs behind an
#      emulated IOMMU, soft-RoCE; e2e/vm/kernel-tests.sh),
#   3. the e2e real twins against a real single-node Kubernetes v1.36 (../shared/harness): the
#      kit's `up`, every `real/...` trial, `down` whatever happened.
# and ends with one line counting them all. Exits non-zero when anything failed.
#
#   e2e/run-tests.sh            everything the machine allows
#
# What each part needs, and what happens without it (each says so in the output):
# - root: kernel tests (throwaway network namespaces), the demo tests, the VM, the real cluster;
#   without root they report themselves skipped and nothing is installed.
# - the VM stage: QEMU and a Debian kernel, installed by e2e/vm/run-in-vm.sh (a QEMU that
#   emulates igb, 8 or later, from the release's backports suite when its own is older).
#   KNIC_SKIP_VM=1 skips it (it says so).
# - the real-cluster stage: the shared harness kit beside the checkout (../shared/harness, or
#   KNIC_HARNESS=<kit dir>). KNIC_E2E_KUBECONFIG set (with KNIC_E2E_NODE, KNIC_E2E_KUBELET_DIR,
#   KNIC_E2E_NRI_SOCKET) runs the twins against that cluster instead and leaves it up; a cluster
#   of the kit that is already up is used and left up. Without either the stage is skipped with
#   a loud line. KNIC_SKIP_REAL=1 skips it (it says so).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export CARGO_TERM_COLOR=never
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"

say() { echo "run-tests: $*"; }
root=false
[ "$(id -u)" = 0 ] && root=true

# ---------------------------------------------------------------- what the tests need
apt_install() {
  if ! $root; then
    say "not root: cannot install $* (the tests that need them say so and skip)"
    return 1
  fi
  say "installing $* (Debian packages)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

# iproute2 (ip, kernel tests in throwaway namespaces), procps (kill, signal tests), util-linux
# (unshare, mount), coreutils (env --default-signal, the demo tests), openssl (the admission
# webhook's test certificates), ca-certificates (crates.io and PyPI over TLS).
need=()
for pair in ip:iproute2 kill:procps unshare:util-linux openssl:openssl python3:python3; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# dnsmasq-base: the DHCP server of the DHCP client trials (e2e/tests/kernel_dhcp.rs).
command -v dnsmasq >/dev/null 2>&1 || need+=(dnsmasq-base)
[ "${#need[@]}" -eq 0 ] || apt_install "${need[@]}" || true

# ethtool: the kernel ethtool trials cross-check features and channels with it (issue 27);
# without it they read back with knic's own ethtool netlink GET only.
command -v ethtool >/dev/null 2>&1 || apt_install ethtool || say "no ethtool: the ethtool trials read back with knic's GET only"

# buildah: charts/image/build.sh builds the image with it (e2e/tests/image.rs, and the helm
# install twin). Without it those report themselves skipped with the reason.
command -v buildah >/dev/null 2>&1 || apt_install buildah || say "no buildah: the image tests will be skipped"

# PyPI: grpcio (a real gRPC C-core client for the kubelet-socket tests), grpcio-tools (the KNI
# client the KNI tests generate from the upstream KNI api.proto), jsonschema (the CDI specs
# against the CDI specification's schema), helm-python-sdk (Helm v4's own engine for the chart
# tests). Pinned, as the tests were checked with these.
pip_install() {
  python3 -m pip install -q --disable-pip-version-check "$@" 2>/dev/null \
    || python3 -m pip install -q --disable-pip-version-check --break-system-packages "$@"
}
for pair in grpc:grpcio==1.85.1 grpc_tools:grpcio-tools==1.85.1 jsonschema:jsonschema==4.26.0 helm_python:helm-python-sdk==0.2.2; do
  python3 -c "import ${pair%%:*}" >/dev/null 2>&1 && continue
  say "installing ${pair#*:} (PyPI)"
  pip_install "${pair#*:}" || say "could not install ${pair#*:}: the tests that need it will fail"
done

log=$(mktemp)
real_log=$(mktemp)
kit=${KNIC_HARNESS:-$repo/../shared/harness}
owned_cluster=false
finish() {
  # A cluster this run started is removed whatever happened (its logs stay in
  # ${HARNESS_DIR:-/var/lib/knic-harness}/logs).
  if $owned_cluster; then
    say "tearing the real cluster down"
    "$kit/down" >&2 || say "down failed"
  fi
  rm -f "$log" "$real_log"
}
trap finish EXIT
status=0

# ---------------------------------------------------------------- 1. cargo test
# The real twins run in stage 3 only, so a KNIC_E2E_* of the caller must not make stage 1 run
# them a first time.
say "cargo test --workspace --locked --no-fail-fast"
if ! env -u KNIC_E2E_KUBECONFIG cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log"; then
  status=1
fi

# ---------------------------------------------------------------- 2. the VM
if [ "${KNIC_SKIP_VM:-0}" = 1 ]; then
  say "SKIPPED: the Debian-kernel VM stage (KNIC_SKIP_VM=1)"
elif ! $root; then
  say "SKIPPED: the Debian-kernel VM stage (needs root to install QEMU and a kernel)"
else
  say "kernel tests in a Debian-kernel VM (VLAN, ipvlan, dummy; SR-IOV, vfio-pci, RDMA on emulated NICs)"
  if ! env -u KNIC_E2E_KUBECONFIG e2e/vm/kernel-tests.sh 2>&1 | tee -a "$log"; then
    status=1
  fi
fi

# ---------------------------------------------------------------- 3. the real cluster
real_stage() {
  if [ -z "${KNIC_E2E_KUBECONFIG:-}" ]; then
    if "$kit/up" --status >/dev/null 2>&1; then
      say "the harness's cluster is already up: using it, leaving it up"
    else
      owned_cluster=true
    fi
    local env
    if ! env=$("$kit/up"); then
      say "FAILED: the real cluster did not come up (logs: ${HARNESS_DIR:-/var/lib/knic-harness}/logs)"
      return 1
    fi
    eval "$env"
    # The twins may restart its apiserver with other feature gates (the gate-off scenarios).
    export KNIC_E2E_HARNESS=$kit
  fi
  say "real cluster: node $KNIC_E2E_NODE, kubeconfig $KNIC_E2E_KUBECONFIG"
  # The twins start the binaries from the target directory.
  cargo build -p knic-driver -p knic-controller --locked 2>&1 | tail -n 1
  # With buildah here, the image twins must run, not skip.
  local require_image=0
  command -v buildah >/dev/null 2>&1 && require_image=1
  local ok=0
  KNIC_E2E_REQUIRE_IMAGE=$require_image cargo test -p knic-e2e --locked --no-fail-fast -- real/ 2>&1 \
    | tee "$real_log" || ok=1
  cat "$real_log" >>"$log"
  return "$ok"
}
if [ "${KNIC_SKIP_REAL:-0}" = 1 ]; then
  say "SKIPPED: the real-cluster stage (KNIC_SKIP_REAL=1)"
elif [ -n "${KNIC_E2E_KUBECONFIG:-}" ]; then
  real_stage || status=1
elif [ ! -x "$kit/up" ]; then
  say "SKIPPED: the real-cluster stage: no harness kit at $kit (put ../shared beside the checkout or set KNIC_HARNESS)"
elif ! $root; then
  say "SKIPPED: the real-cluster stage: the harness needs root"
else
  real_stage || status=1
fi

# ---------------------------------------------------------------- one closing line
# cargo's own last line is only a crate's doc-test summary; this one counts every test run.
count() {
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1); if ($i ~ /^ignored/) s += $(i-1) } }
       END { printf "%d passed, %d failed, %d skipped", p, f, s }' "$1"
}
# Stage 3 runs only `real/...` trials (the filter leaves the others "filtered out", uncounted).
echo "tests: $(count "$log"); of them real-cluster twins: $(count "$real_log")"
exit "$status"
