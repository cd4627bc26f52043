#!/usr/bin/env bash
# Copy bandwidth from a booted VM guest: QEMU under TCG boots Debian's cloud kernel with Flyt's
# libcuda.so.1 and benchmarks/guest_copy.c in its initramfs, against an rpc-server on the host
# (the emulated device; no GPU needed). The guest copies through its ivshmem region (control on a
# virtio-serial port), then through TCP alone (QEMU's user-mode network), and times its own
# memcpy: under TCG the guest's own memory speed, not Flyt, bounds what any channel can reach.
#
#   benchmarks/vm-guest.sh [REPS]     (default 9 copies per size; prints a markdown table)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
FLYT_CUDA_HOME=$(.ci/fetch-cuda-toolkit)
FLYT_GUEST_KERNEL=$(.ci/fetch-guest-kernel)
export FLYT_CUDA_HOME FLYT_GUEST_KERNEL FLYT_GUEST_REPS=${1:-9}
cargo build --release --workspace --locked >&2
cargo test --release --locked -p flyt-cuda-cdylib --test vm_guest -- --ignored --nocapture --exact guest_copy_bandwidth 2>&1 \
    | grep -E '^\| |^server counters'
