#!/usr/bin/env bash
# CI entry for the kernel tests that need what the CI machine's kernel may lack: builds each
# kernel test binary on the host and runs it as root in a Debian-kernel VM (e2e/vm/run-in-vm.sh),
# where such a lack fails the trial instead of skipping it.
#
#   kernel_netns  link types (VLAN, ipvlan, dummy, ...): the VM's default modules.
#   sriov_vm      SR-IOV, vfio-pci and RDMA on emulated hardware: two Intel 82576 NICs (QEMU's
#                 `igb`, each behind a PCIe root port) behind an emulated IOMMU (`intel-iommu`,
#                 kernel `intel_iommu=on`), the igb/igbvf/vfio-pci and soft-RoCE modules, and
#                 the real knic-driver binary (built here, copied into the VM). Needs QEMU 8 or
#                 later for `igb`; run-in-vm.sh installs it from backports when the release's
#                 own is older (bookworm: 7.2).
#
# Usage: e2e/vm/kernel-tests.sh [ARGS...]   (ARGS go to every test binary, e.g. a name filter)
# Environment: KNIC_VM_TESTS, the e2e test targets to run (default: kernel_netns sriov_vm);
# everything run-in-vm.sh reads (KNIC_VM_TIMEOUT, KNIC_VM_CPUS, ...). Exits non-zero when any
# run fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TERM_COLOR=never
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

# The run-in-vm.sh options a test target needs (one per line).
vm_options() {
  case "$1" in
    sriov_vm)
      local driver=$CARGO_TARGET_DIR/debug/knic-driver
      printf '%s\n' --machine q35 --device intel-iommu \
        --device pcie-root-port,id=rp1,chassis=1 --device igb,bus=rp1 \
        --device pcie-root-port,id=rp2,chassis=2 --device igb,bus=rp2 \
        --append 'intel_iommu=on iommu=pt' \
        --module igb --module igbvf --module vfio-pci \
        --module rdma_rxe --module crc32_generic --module ib_uverbs --module rdma_ucm \
        --memory 2048 --timeout 900 \
        --copy "$driver" --env "KNIC_DRIVER_BIN=$driver"
      ;;
  esac
}

status=0
for test in ${KNIC_VM_TESTS:-kernel_netns sriov_vm}; do
  echo "kernel-tests: building $test"
  exe=$(cargo test -p knic-e2e --test "$test" --locked --no-run --message-format=json |
    grep -o "\"executable\":\"[^\"]*/$test-[0-9a-f]*\"" | tail -n 1 | cut -d'"' -f4)
  [ -n "$exe" ] || { echo "kernel-tests: error: cargo built no executable for test $test" >&2; exit 2; }
  mapfile -t options < <(vm_options "$test")
  if [ "$test" = sriov_vm ]; then
    cargo build -p knic-driver --locked 2>&1 | tail -n 1
  fi
  echo "kernel-tests: running $test in the VM"
  started=$(date +%s)
  if ! e2e/vm/run-in-vm.sh "${options[@]}" -- "$exe" "$@"; then
    echo "kernel-tests: $test failed in the VM" >&2
    status=1
  fi
  echo "kernel-tests: $test took $(($(date +%s) - started))s in the VM"
done
exit "$status"
