#!/usr/bin/env bash
# Checks e2e/vm/run-in-vm.sh itself: that the VM's kernel really creates every link type kernel
# tests rely on (VLAN, ipvlan, dummy, macvlan, bridge, veth, vxlan), that arguments and --env
# values reach the test verbatim with KNIC_IN_VM=1, that the test's exit code comes back, and
# that a crash, a hang, a module that will not load, an unknown module and a missing executable
# each end with their documented status and message, leaving no temp directory behind; bad
# --device/--append/--module/--memory values are refused before anything boots.
#
# Usage: e2e/vm/selftest.sh   (about 45 s here; needs what run-in-vm.sh needs)
set -euo pipefail
cd "$(dirname "$0")/../.."
runner=$PWD/e2e/vm/run-in-vm.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/knic-vm-selftest.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The runner's own temp dirs go here, so a leak is seen.
export TMPDIR=$work/tmp
mkdir -p "$TMPDIR"
failures=0

# expect NAME STATUS PATTERN... -- RUNNER-ARGS...: runs the runner, checks its exit status and
# that each grep -E pattern occurs in its combined output.
expect() {
  local name=$1 want=$2 got out
  shift 2
  local patterns=()
  while [ "$1" != -- ]; do patterns+=("$1"); shift; done
  shift
  out=$work/$name.out
  set +e
  "$runner" "$@" >"$out" 2>&1
  got=$?
  set -e
  local ok=1
  if [ "$got" != "$want" ]; then
    echo "selftest: $name: exit status $got, want $want" >&2
    ok=
  fi
  for p in "${patterns[@]}"; do
    if ! grep -Eq -- "$p" "$out"; then
      echo "selftest: $name: output lacks /$p/" >&2
      ok=
    fi
  done
  if [ -z "$ok" ]; then
    sed 's/^/    | /' "$out" >&2
    failures=$((failures + 1))
  else
    echo "selftest: $name: ok (exit $got)"
  fi
}

cat >"$work/features" <<'EOF'
#!/bin/sh
for a in "$@"; do echo "arg<$a>"; done
echo "X=<$X> KNIC_IN_VM=<$KNIC_IN_VM>"
set -e
# Debian's busybox shell runs its own applets before PATH: iproute2's ip by path.
ip() { /usr/sbin/ip "$@"; }
ip link add knt-d0 type dummy
ip link set knt-d0 up
ip link add link knt-d0 name knt-d0.100 type vlan id 100
ip link add link knt-d0 name knt-iv0 type ipvlan mode l2
# One lower device cannot carry both ipvlan and macvlan children (EBUSY).
ip link add knt-d1 type dummy
ip link add link knt-d1 name knt-mv0 type macvlan mode bridge
ip link add knt-br0 type bridge
ip link add knt-ve0 type veth peer name knt-ve1
ip link add knt-vx0 type vxlan id 42 dstport 4789 dev knt-d0
ip netns add knt-ns
ip link set knt-ve1 netns knt-ns
ip -n knt-ns link show knt-ve1 >/dev/null
ip netns del knt-ns
[ -d /sys/module/8021q ]
echo "links: vlan ipvlan dummy macvlan bridge veth vxlan netns ok"
exit 7
EOF
printf '#!/bin/sh\necho crashing; kill -SEGV $$\n' >"$work/crash"
printf '#!/bin/sh\necho hanging; exec sleep 1000\n' >"$work/hang"
chmod +x "$work/features" "$work/crash" "$work/hang"

# shellcheck disable=SC2016 # the $ signs are literal: they must reach the test unexpanded
expect features 7 \
  '^arg<a b>' "^arg<it's>" '^arg<\$HOME>' "^X=<it's a \\\$b> KNIC_IN_VM=<1>" \
  '^links: vlan ipvlan dummy macvlan bridge veth vxlan netns ok' 'exited with 7 in the VM' \
  -- --env "X=it's a \$b" "$work/features" "a b" "it's" '$HOME'
expect crash 139 'killed by signal 11' -- "$work/crash"
expect hang 4 '^hanging' 'did not finish within 20s' -- --timeout 20 "$work/hang"
expect setup-failure 3 "the VM's setup failed: insmod .*kvm-intel" -- --module kvm_intel "$work/crash"
expect unknown-module 2 'module knt-nosuch is not in kernel' -- --module knt-nosuch "$work/crash"
expect missing-executable 2 'test executable /knt-nonexistent does not exist' -- /knt-nonexistent
expect bad-env 2 '--env 1X=y: expected NAME=VALUE' -- --env 1X=y "$work/crash"
expect bad-device 2 '--device igb;x: expected DRIVER\[,PROP=VALUE\.\.\.\]' -- --device 'igb;x' "$work/crash"
expect bad-append 2 '--append a\$b: only plain kernel parameters' -- --append 'a$b' "$work/crash"
expect bad-module 2 '--module igb max_vfs=\$x: expected a module name' -- --module 'igb max_vfs=$x' "$work/crash"
expect bad-memory 2 '--memory 1G: expected a number of MiB' -- --memory 1G "$work/crash"

if [ -n "$(ls -A "$TMPDIR")" ]; then
  echo "selftest: the runner left temp files behind: $(ls -A "$TMPDIR")" >&2
  failures=$((failures + 1))
fi
if [ "$failures" -gt 0 ]; then
  echo "selftest: $failures failed" >&2
  exit 1
fi
echo "selftest: all passed"
