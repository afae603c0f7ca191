#!/usr/bin/env bash
# Runs one test executable as root inside a throwaway Debian-kernel VM and exits with its exit
# code.
#
# Why: kernel tests need link types (VLAN/8021q, ipvlan, dummy, ...) that the CI machine's own
# kernel may lack, and they must never touch the host's network. Debian's stock kernel
# (linux-image-amd64) has all of them as modules and boots under QEMU's software emulation (no
# KVM needed) from a small initramfs in seconds. The VM has no network device at all.
#
# What it does: picks the newest /boot/vmlinuz-<ver> that has /lib/modules/<ver>; builds an
# uncompressed initramfs in a temp dir holding busybox, iproute2's `ip` (with its shared
# libraries), the kernel modules asked for with their dependencies (modprobe --show-depends
# against that kernel's module tree), the test executable (with its shared libraries) and an
# /init that mounts proc/sys/dev/run/tmp, loads the modules, brings `lo` up, exports
# KNIC_IN_VM=1 (so a test knows a missing kernel feature is a failure there, not a skip), runs
# the test with the given arguments, prints `KNIC-VM-EXIT=<code>` and powers off. QEMU runs
# under `timeout`; the serial console is streamed to stdout.
#
# Needs (installed with apt-get when missing and running as root): linux-image-amd64,
# qemu-system-x86, busybox-static, iproute2, cpio, kmod (modprobe). Nothing else: no KVM, no
# network, no disk image. A --device the installed QEMU does not emulate (igb, Intel's 82576
# with SR-IOV, needs QEMU 8 or later; bookworm has 7.2) installs qemu-system-x86 from the
# release's backports suite (`<codename>-backports`, added to apt's sources on the machine's
# Debian mirror when missing), and the run fails if even that QEMU lacks it.
#
# In the VM: PATH=/usr/sbin:/usr/bin:/sbin:/bin with iproute2's ip in /usr/sbin and busybox's
# applets in /bin (a shell script there gets busybox's `ip` unless it calls /usr/sbin/ip);
# tmpfs /run (/var/run links to it, for `ip netns`) and /tmp; no network device unless a
# --device adds one (emulated NICs have no backend: nothing leaves the VM); cwd /.
#
# Usage: e2e/vm/run-in-vm.sh [options] [--] TEST-EXECUTABLE [ARGS...]
#   --env NAME=VALUE   export this in the VM before the test starts (repeatable)
#   --module NAME      load this module too (repeatable; the defaults are in KNIC_VM_MODULES)
#   --module 'NAME PARAMS'  load it with these module parameters (e.g. 'ib_core netns_mode=0')
#   --copy PATH        put this host executable (and its libraries) at the same path in the VM
#   --timeout SECONDS  wall-clock bound of the whole VM run (default 300, KNIC_VM_TIMEOUT)
#   --machine TYPE     QEMU machine type (default QEMU's `pc`; PCIe devices with SR-IOV need q35)
#   --device SPEC      add QEMU `-device SPEC` (repeatable, in order: an IOMMU such as
#                      intel-iommu must come before the devices it translates for)
#   --append TEXT      more kernel command line (repeatable), e.g. 'intel_iommu=on iommu=pt'
#   --memory MIB       the VM's memory (default 1024, KNIC_VM_MEMORY); the initramfs holds every
#                      copied executable, so large debug binaries need more
#
# An emulated SR-IOV NIC with an IOMMU, each VF in its own IOMMU group:
#   run-in-vm.sh --machine q35 --device intel-iommu --device igb --append 'intel_iommu=on iommu=pt'
#     --module igb --module igbvf --module vfio-pci -- TEST
# Environment: KNIC_VM_KERNEL=<ver> picks a kernel; KNIC_VM_MEMORY (MiB, default 1024);
# KNIC_VM_CPUS (default 2); KNIC_VM_MODULES (default: 8021q ipvlan macvlan veth dummy bridge
# vxlan sch_tbf vrf); KNIC_VM_NO_INSTALL=1 never runs apt.
#
# Exit status: the test's own exit code; 2 for bad usage or a missing tool/kernel; 3 when the
# VM's setup failed (a module would not load); 4 when the VM ended without reporting an exit
# code (hung past the timeout, kernel panic, /init died). A test exiting 2-4 itself is told apart
# by the last line on stderr.
set -euo pipefail

prog=run-in-vm
# die MESSAGE [STATUS]: the message on stderr, then exit (2 unless given).
die() { echo "$prog: error: $1" >&2; exit "${2:-2}"; }
say() { echo "$prog: $*" >&2; }

read -r -a modules <<<"${KNIC_VM_MODULES:-8021q ipvlan macvlan veth dummy bridge vxlan sch_tbf vrf}"
timeout_s=${KNIC_VM_TIMEOUT:-300}
memory=${KNIC_VM_MEMORY:-1024}
machine=
envs=()
copies=()
devices=()
append=
while [ $# -gt 0 ]; do
  case "$1" in
    --env) [ $# -ge 2 ] || die "--env needs NAME=VALUE"
      [[ "$2" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env $2: expected NAME=VALUE"
      envs+=("$2"); shift 2 ;;
    --module) [ $# -ge 2 ] || die "--module needs a name"
      [[ "$2" =~ ^[A-Za-z0-9_-]+(\ [A-Za-z0-9_.,=-]+)*$ ]] ||
        die "--module $2: expected a module name, optionally followed by NAME=VALUE parameters"
      modules+=("$2"); shift 2 ;;
    --machine) [ $# -ge 2 ] || die "--machine needs a type"
      [[ "$2" =~ ^[A-Za-z0-9_.,=-]+$ ]] || die "--machine $2: expected a QEMU machine type such as q35"
      machine=$2; shift 2 ;;
    --device) [ $# -ge 2 ] || die "--device needs a QEMU device spec"
      [[ "$2" =~ ^[A-Za-z0-9_-]+(,[A-Za-z0-9_.:=-]+)*$ ]] ||
        die "--device $2: expected DRIVER[,PROP=VALUE...] (e.g. igb,bus=pcie.0)"
      devices+=("$2"); shift 2 ;;
    --append) [ $# -ge 2 ] || die "--append needs kernel command line text"
      [[ "$2" =~ ^[A-Za-z0-9_.,=:\ -]+$ ]] || die "--append $2: only plain kernel parameters (letters, digits, _.,=:- and spaces)"
      append="$append $2"; shift 2 ;;
    --memory) [ $# -ge 2 ] || die "--memory needs MiB"
      [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "--memory $2: expected a number of MiB"
      memory=$2; shift 2 ;;
    --copy) [ $# -ge 2 ] || die "--copy needs a path"; copies+=("$2"); shift 2 ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"
      [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "--timeout $2: expected a positive number of seconds"
      timeout_s=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || die "no test executable given (usage: $0 [options] [--] TEST-EXECUTABLE [ARGS...])"
test_bin=$1
shift
{ [ -f "$test_bin" ] && [ -x "$test_bin" ]; } || die "test executable $test_bin does not exist or is not executable"

# --- tools -------------------------------------------------------------------------------------

# The newest kernel version with both an image and a module tree, or nothing.
pick_kernel() {
  local v
  if [ -n "${KNIC_VM_KERNEL:-}" ]; then
    echo "$KNIC_VM_KERNEL"
    return
  fi
  for f in $(find /boot -maxdepth 1 -name 'vmlinuz-*' 2>/dev/null | sort -V -r); do
    v=${f#/boot/vmlinuz-}
    if [ -f "/lib/modules/$v/modules.dep" ]; then
      echo "$v"
      return
    fi
  done
}

# The QEMU device names asked for (`igb` of `igb,bus=pcie.0`).
device_names=()
for d in "${devices[@]}"; do device_names+=("${d%%,*}"); done

# The device names of `device_names` the installed QEMU lacks (all of them without QEMU).
missing_devices() {
  local known d
  known=$(qemu-system-x86_64 -device help 2>/dev/null || true)
  for d in "${device_names[@]}"; do
    grep -q "^name \"$d\"" <<<"$known" || echo "$d"
  done
}

# The release's backports suite on apt's sources, added on the machine's Debian mirror (the
# URIs of its own sources, else deb.debian.org) when missing.
backports_suite() {
  local codename suite mirror
  codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || die "cannot tell the Debian release (no VERSION_CODENAME in /etc/os-release) to find its backports suite"
  suite=$codename-backports
  if ! grep -Eqs "^[^#]*[[:space:]]$suite([[:space:]]|\$)" /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; then
    mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null |
      grep -E '/debian/?$' | head -n 1 || true)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    say "adding $suite ($mirror) to apt's sources, for a QEMU that emulates ${device_names[*]}"
    {
      printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\n' "$mirror" "$suite"
      [ ! -f /usr/share/keyrings/debian-archive-keyring.gpg ] ||
        printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    } >"/etc/apt/sources.list.d/knic-$suite.sources" || die "cannot write /etc/apt/sources.list.d/knic-$suite.sources"
  fi
  echo "$suite"
}

# Why nothing may be installed now, if so.
no_install_reason() {
  if [ "${KNIC_VM_NO_INSTALL:-}" = 1 ]; then echo "KNIC_VM_NO_INSTALL=1 forbids installing them"
  elif [ "$(id -u)" != 0 ]; then echo "installing them needs root"
  elif ! command -v apt-get >/dev/null 2>&1; then echo "there is no apt-get to install them"
  fi
}

need=()
if [ "${#devices[@]}" -gt 0 ] && [ -n "$(missing_devices)" ]; then
  lacking=$(missing_devices | tr '\n' ' ')
  why=$(no_install_reason)
  [ -z "$why" ] || die "QEMU lacks the devices ${lacking% } and a newer qemu-system-x86 from backports is needed: $why"
  suite=$(backports_suite)
  say "installing qemu-system-x86 from $suite (emulates ${lacking% })"
  apt-get update -qq || die "apt-get update failed (installing qemu-system-x86 from $suite)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t "$suite" qemu-system-x86 >/dev/null ||
    die "apt-get install -t $suite qemu-system-x86 failed"
  lacking=$(missing_devices | tr '\n' ' ')
  [ -z "$lacking" ] || die "$(qemu-system-x86_64 --version | head -n 1) from $suite does not emulate ${lacking% }"
fi
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v busybox >/dev/null 2>&1 || need+=(busybox-static)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v cpio >/dev/null 2>&1 || need+=(cpio)
command -v modprobe >/dev/null 2>&1 || need+=(kmod)
[ -n "$(pick_kernel)" ] || need+=(linux-image-amd64)
if [ "${#need[@]}" -gt 0 ]; then
  why=$(no_install_reason)
  [ -z "$why" ] || die "missing Debian packages ${need[*]}: $why"
  say "installing ${need[*]}"
  apt-get update -qq || die "apt-get update failed (installing ${need[*]})"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
    die "apt-get install ${need[*]} failed"
fi
command -v qemu-system-x86_64 >/dev/null 2>&1 || die "qemu-system-x86_64 not found after installing qemu-system-x86"
kver=$(pick_kernel)
[ -n "$kver" ] || die "no /boot/vmlinuz-<ver> with a matching /lib/modules/<ver> after installing linux-image-amd64 (does a dpkg path-exclude drop /boot?)"
kernel=/boot/vmlinuz-$kver
[ -r "$kernel" ] || die "kernel image $kernel does not exist or is not readable"
[ -f "/lib/modules/$kver/modules.dep" ] || die "no module tree /lib/modules/$kver for kernel $kver"

# --- initramfs ---------------------------------------------------------------------------------

tmp=$(mktemp -d "${TMPDIR:-/tmp}/knic-vm.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
root=$tmp/root
t0=$(date +%s.%N)

mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,tmp,root,knic/bin,lib/modules/"$kver"}
mkdir -p "$root/var"
ln -s ../run "$root/var/run"

# Copies an executable to `dest` inside the VM, with every shared library it needs (and the
# loader) at the path the host's loader resolved.
copy_exe() {
  local src=$1 dest=$2 lib
  install -D -m 0755 "$src" "$root$dest"
  # Debug builds are mostly DWARF, which the VM never reads but would unpack into its RAM on
  # every boot under emulation: dropped when binutils is here (symbols stay for backtraces).
  if [ "$(stat -c %s "$src")" -gt 8000000 ] && command -v objcopy >/dev/null 2>&1; then
    objcopy --strip-debug "$root$dest" 2>/dev/null || install -m 0755 "$src" "$root$dest"
  fi
  # ldd fails on static executables, which need nothing more.
  { ldd "$src" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
    while read -r lib; do
      [ -e "$root$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
    done
}

copy_exe "$(command -v busybox)" /bin/busybox
for applet in $("$root/bin/busybox" --list); do
  [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
# iproute2's ip, not busybox's applet: PATH puts /usr/sbin first for executables. (Debian's
# busybox shell runs its applets before searching PATH, so a shell script in the VM calls
# /usr/sbin/ip by path.)
copy_exe "$(command -v ip)" /usr/sbin/ip
# iproute2's tc, for the egress-limit trials that read qdiscs back as JSON (busybox's has no -j).
copy_exe "$(command -v tc)" /usr/sbin/tc
# iproute2's bridge, for the overlay trial that reads VXLAN forwarding entries back.
copy_exe "$(command -v bridge)" /usr/sbin/bridge
# iproute2's rdma, for the RDMA trials (soft-RoCE links, the namespace mode).
copy_exe "$(command -v rdma)" /usr/sbin/rdma
# The CA bundle: kube's client (the driver's, a test's) loads the system roots even for a
# plain-HTTP apiserver such as the fake one, and fails without any.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
for c in "${copies[@]}"; do
  [ -x "$c" ] || die "--copy $c: not an executable"
  copy_exe "$(readlink -f "$c")" "$c"
done

# Modules in load order (dependencies first, each once), uncompressed: busybox insmod does not
# decompress.
: >"$root/knic/modules"
declare -A seen=()
# Parameters given with --module 'NAME PARAMS', by module name (- and _ are one to the kernel),
# applied wherever the module loads, also as another's dependency.
declare -A given=()
for m in "${modules[@]}"; do
  read -r name params <<<"$m"
  [ -z "$params" ] || given[${name//-/_}]=$params
done
for m in "${modules[@]}"; do
  m=${m%% *}
  deps=$(modprobe -S "$kver" --show-depends "$m" 2>&1) ||
    die "module $m is not in kernel $kver's module tree: $deps"
  while read -r kind path params; do
    [ "$kind" = insmod ] || continue
    [ -z "${seen[$path]:-}" ] || continue
    seen[$path]=1
    base=$(basename "$path")
    base=${base%%.ko*}
    params="$params ${given[${base//-/_}]:-}"
    rel=${path#/lib/modules/"$kver"/}
    case "$rel" in
      *.xz) tool=xz ;; *.zst) tool=zstd ;; *.gz) tool=gzip ;; *) tool=install ;;
    esac
    command -v "$tool" >/dev/null 2>&1 || die "module $path is compressed and $tool is missing to unpack it"
    case "$rel" in
      *.ko.xz) out=${rel%.xz}; mkdir -p "$(dirname "$root/lib/modules/$kver/$out")"; xz -dc "$path" >"$root/lib/modules/$kver/$out" ;;
      *.ko.zst) out=${rel%.zst}; mkdir -p "$(dirname "$root/lib/modules/$kver/$out")"; zstd -qdc "$path" >"$root/lib/modules/$kver/$out" ;;
      *.ko.gz) out=${rel%.gz}; mkdir -p "$(dirname "$root/lib/modules/$kver/$out")"; gzip -dc "$path" >"$root/lib/modules/$kver/$out" ;;
      *) out=$rel; install -D -m 0644 "$path" "$root/lib/modules/$kver/$out" ;;
    esac
    echo "/lib/modules/$kver/$out $params" >>"$root/knic/modules"
  done <<<"$deps"
done

# The test and its arguments, single-quoted for /init's shell.
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
# A name safe to write into /init unquoted.
test_name=$(basename "$test_bin" | tr -c 'A-Za-z0-9._\n-' '_')
copy_exe "$test_bin" "/knic/bin/$test_name"
{
  printf 'set --'
  for a in "$@"; do printf ' %s' "$(quote "$a")"; done
  printf '\n'
  for e in "${envs[@]}"; do printf 'export %s=%s\n' "${e%%=*}" "$(quote "${e#*=}")"; done
} >"$root/knic/args"

cat >"$root/init" <<EOF
#!/bin/sh
# PID 1 of the test VM (written by e2e/vm/run-in-vm.sh).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp TERM=dumb KNIC_IN_VM=1
setup_failed() { echo; echo "KNIC-VM-SETUP-FAILED=\$*"; poweroff -f; sleep 10; }
mount -t proc proc /proc || setup_failed "mounting /proc"
mount -t sysfs sysfs /sys || setup_failed "mounting /sys"
mount -t devtmpfs devtmpfs /dev || setup_failed "mounting /dev"
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run || setup_failed "mounting /run"
mount -t tmpfs tmpfs /tmp || setup_failed "mounting /tmp"
while read -r mod params; do
  insmod "\$mod" \$params || setup_failed "insmod \$mod \$params"
done </knic/modules
/usr/sbin/ip link set lo up || setup_failed "ip link set lo up"
. /knic/args
cd /
echo "KNIC-VM: kernel \$(uname -r), running $test_name \$*"
/knic/bin/$test_name "\$@"
code=\$?
echo
echo "KNIC-VM-EXIT=\$code"
poweroff -f
sleep 10
EOF
chmod 0755 "$root/init"

img=$tmp/initramfs.cpio
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$img"
t1=$(date +%s.%N)
say "initramfs $(du -h "$img" | cut -f1) for kernel $kver built in $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}")s; booting (timeout ${timeout_s}s)"

# --- boot --------------------------------------------------------------------------------------

log=$tmp/serial.log
qemu_devices=()
for d in "${devices[@]}"; do qemu_devices+=(-device "$d"); done
[ "${#devices[@]}" -eq 0 ] || say "devices: ${devices[*]}${machine:+ (machine $machine)}"
set +e
timeout -k 5 "$timeout_s" qemu-system-x86_64 \
  -machine "${machine:+$machine,}accel=tcg" -smp "${KNIC_VM_CPUS:-2}" -m "$memory" \
  -nodefaults -display none -serial stdio -monitor none -nic none -no-reboot \
  "${qemu_devices[@]}" \
  -kernel "$kernel" -initrd "$img" \
  -append "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init$append" </dev/null 2>&1 | tee "$log"
status=("${PIPESTATUS[@]}")
set -e
t2=$(date +%s.%N)
elapsed=$(awk "BEGIN{printf \"%.1f\", $t2 - $t1}")

setup=$(sed -n 's/^KNIC-VM-SETUP-FAILED=\(.*\)\r\{0,1\}$/\1/p' "$log" | tail -n 1)
[ -z "$setup" ] || die "the VM's setup failed: $setup (after ${elapsed}s)" 3
code=$(sed -n 's/^KNIC-VM-EXIT=\([0-9]\{1,3\}\)\r\{0,1\}$/\1/p' "$log" | tail -n 1)
if [ -z "$code" ]; then
  case "${status[0]}" in
    124|137) die "the VM did not finish within ${timeout_s}s (hung?); it was killed" 4 ;;
    *) die "the VM stopped (qemu exit ${status[0]}) after ${elapsed}s without reporting the test's exit code (kernel panic or /init died; see the serial output above)" 4 ;;
  esac
fi
if [ "$code" -gt 128 ]; then
  say "$test_name was killed by signal $((code - 128)) in the VM (after ${elapsed}s)"
else
  say "$test_name exited with $code in the VM (boot and test ${elapsed}s)"
fi
exit "$code"
