#!/usr/bin/env bash
# CI entry for the kernel tests that need link types the CI machine's kernel may lack (VLAN,
# ipvlan, dummy): builds each kernel test binary on the host and runs it as root in a Debian-kernel
# VM (e2e/vm/run-in-vm.sh), where such a lack fails the trial instead of skipping it.
#
# Usage: e2e/vm/kernel-tests.sh [ARGS...]   (ARGS go to every test binary, e.g. a name filter)
# Environment: KNIC_VM_TESTS, the e2e test targets to run (default: kernel_netns); everything
# run-in-vm.sh reads (KNIC_VM_TIMEOUT, KNIC_VM_CPUS, ...). Exits non-zero when any run fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TERM_COLOR=never

status=0
for test in ${KNIC_VM_TESTS:-kernel_netns}; do
  echo "kernel-tests: building $test"
  exe=$(cargo test -p knic-e2e --test "$test" --locked --no-run --message-format=json |
    grep -o "\"executable\":\"[^\"]*/$test-[0-9a-f]*\"" | tail -n 1 | cut -d'"' -f4)
  [ -n "$exe" ] || { echo "kernel-tests: error: cargo built no executable for test $test" >&2; exit 2; }
  echo "kernel-tests: running $test in the VM"
  if ! e2e/vm/run-in-vm.sh -- "$exe" "$@"; then
    echo "kernel-tests: $test failed in the VM" >&2
    status=1
  fi
done
exit "$status"
