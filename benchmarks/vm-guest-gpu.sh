#!/usr/bin/env bash
# Copy bandwidth from a booted VM guest on the GPU machine, beside native and Flyt on the host.
# The GPU machine has no Rust and no network, so this runs in two halves:
#
#   benchmarks/vm-guest-gpu.sh pack DIR                    (here: QEMU with its libraries and
#       firmware, Debian's cloud kernel, the guest's initramfs with Flyt's libcuda.so.1 and
#       benchmarks/guest_copy.c, and guest_copy built for the host; carry DIR with the dist)
#   benchmarks/vm-guest-gpu.sh run --pack DIR --dist DIR [--reps N] [--device emulated]
#       (on the GPU machine; `--device emulated` tries the script anywhere, with no native run)
#
# The guest's figures are set by QEMU as much as by Flyt: under TCG every guest instruction is
# emulated (the guest's own memcpy column shows the ceiling that puts on pageable copies).
#
# `run` starts an rpc-server on the GPU serving an ivshmem region, then times guest_copy natively,
# through Flyt on the host (the region file; TCP alone), and in a guest booted by QEMU under TCG
# (and under KVM where /dev/kvm opens): through its region with its control on a virtio-serial
# port, and through TCP alone (QEMU's user network). Prints a markdown table of median GB/s.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
port=17000

pack() {
    local out=$1
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    cd "$root"
    local cuda kernel tmp
    cuda=$(.ci/fetch-cuda-toolkit)
    kernel=$(.ci/fetch-guest-kernel)
    cargo build --release --locked -p flyt-cuda-cdylib -p flyt-test-support >&2
    tmp=$(mktemp -d)
    mkdir -p "$tmp/lib" "$tmp/qemu/lib" "$tmp/qemu/firmware"
    ln -s "$root/target/release/libflyt_libcuda.so" "$tmp/lib/libcuda.so.1"
    cc -std=gnu11 -O2 -Wall -Werror -I"$cuda/include" benchmarks/guest_copy.c -o "$out/guest_copy" -L"$tmp/lib" -l:libcuda.so.1
    cat > "$tmp/init.sh" <<INIT
ip link set lo up; ip addr add 10.0.2.15/24 dev eth0; ip link set eth0 up
grep -q hypervisor /proc/cpuinfo && echo "guest cpu: \$(grep -m1 'model name' /proc/cpuinfo)"
reps=\$(cat /proc/cmdline | sed -n 's/.*flyt_reps=\([0-9]*\).*/\1/p')
label=\$(cat /proc/cmdline | sed -n 's/.*flyt_label=\([a-z]*\).*/\1/p')
FLYT_SERVER=serial:\$(port flyt.0) FLYT_SHM=on guest_copy \$label-ivshmem \${reps:-9}
FLYT_SERVER=10.0.2.2:$port FLYT_SHM=off FLYT_IVSHMEM=off guest_copy \$label-tcp \${reps:-9}
INIT
    target/release/flyt-guest-image --kernel "$kernel" --libs "$tmp/lib" --init "$tmp/init.sh" --out "$tmp/initrd.cpio" "$out/guest_copy" >/dev/null
    gzip -9 -c "$tmp/initrd.cpio" > "$out/initrd.cpio.gz"
    cp "$kernel/vmlinuz" "$out/vmlinuz"
    # QEMU runs through its own loader and libraries: the GPU machine's may be older.
    local qemu
    qemu=$(command -v qemu-system-x86_64)
    cp "$qemu" "$tmp/qemu/"
    ldd "$qemu" | awk '/=> \// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do cp -L "$lib" "$tmp/qemu/lib/"; done
    # Debian builds TCG as a module QEMU loads at run time (QEMU_MODULE_DIR in `run`).
    mkdir -p "$tmp/qemu/modules"
    cp /usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so "$tmp/qemu/modules/" 2>/dev/null || true
    for blob in bios-256k.bin kvmvapic.bin linuxboot_dma.bin linuxboot.bin efi-virtio.rom vgabios-stdvga.bin; do
        found=$(find /usr/share/qemu /usr/share/seabios /usr/lib/ipxe/qemu -name "$blob" 2>/dev/null | head -n1)
        [ -n "$found" ] && cp -L "$found" "$tmp/qemu/firmware/"
    done
    tar -C "$tmp" -cJf "$out/qemu.tar.xz" qemu
    rm -rf "$tmp"
    du -sh "$out" >&2
}

run() {
    local pack dist reps=9 device=cuda
    while [ $# -gt 0 ]; do
        case $1 in
            --pack) pack=$(cd "${2:?}" && pwd); shift 2 ;;
            --dist) dist=$(cd "${2:?}" && pwd); shift 2 ;;
            --reps) reps=${2:?}; shift 2 ;;
            --device) device=${2:?}; shift 2 ;;
            *) echo "usage: benchmarks/vm-guest-gpu.sh run --pack DIR --dist DIR [--reps N] [--device emulated]" >&2; exit 2 ;;
        esac
    done
    [ -n "${pack:-}" ] && [ -n "${dist:-}" ] || { echo "run needs --pack and --dist" >&2; exit 2; }
    local out
    tmp=$(mktemp -d) server=
    regions=/dev/shm/flyt-vmbench-$$ # the GPU driver pins only shared-memory pages
    trap '[ -z "$server" ] || kill "$server" 2>/dev/null; rm -rf "$tmp" "$regions"' EXIT
    tar -C "$tmp" -xJf "$pack/qemu.tar.xz"
    local q=$tmp/qemu
    "$dist/bin/flytctl" ivshmem create vm1 --dir "$regions" --size 512MiB --sessions 2 >/dev/null
    FLYT_LOG=info "$dist/bin/flyt-rpc-server" --device "$device" --listen "unix:$tmp/rpc.sock" --listen "127.0.0.1:$port" \
        --ivshmem-dir "$regions" --handshake-timeout-secs 600 >"$tmp/server.out" 2>"$tmp/server.err" &
    server=$!
    for _ in $(seq 300); do grep -q '^flyt-rpc-server listening on ' "$tmp/server.out" && break; sleep 0.1; done
    grep -q '^flyt-rpc-server listening on ' "$tmp/server.out" || { cat "$tmp/server.err" >&2; exit 1; }
    out=$tmp/bw.txt
    [ "$device" != cuda ] || "$pack/guest_copy" native "$reps" >>"$out"
    LD_LIBRARY_PATH=$dist/lib FLYT_SERVER=127.0.0.1:$port FLYT_SHM=on FLYT_IVSHMEM=$regions/vm1 "$pack/guest_copy" host-ivshmem "$reps" >>"$out"
    LD_LIBRARY_PATH=$dist/lib FLYT_SERVER=127.0.0.1:$port FLYT_SHM=off FLYT_IVSHMEM=off "$pack/guest_copy" host-tcp "$reps" >>"$out"
    boot() { # label seconds accel...
        local label=$1 seconds=$2
        shift 2
        QEMU_MODULE_DIR=$q/modules timeout "$seconds" "$q/lib/ld-linux-x86-64.so.2" --library-path "$q/lib" "$q/qemu-system-x86_64" -L "$q/firmware" \
            "$@" -m 1024 -smp 2 -no-reboot -display none -vga none -monitor none -serial stdio \
            -kernel "$pack/vmlinuz" -initrd "$pack/initrd.cpio.gz" \
            -append "console=ttyS0 quiet panic=-1 flyt_reps=$reps flyt_label=$label" \
            -object "memory-backend-file,id=flyt-vm1,share=on,mem-path=$regions/vm1,size=512M" -device ivshmem-plain,memdev=flyt-vm1 \
            -device virtio-serial-pci -chardev "socket,id=flyt0,path=$tmp/rpc.sock" -device virtserialport,chardev=flyt0,name=flyt.0 \
            -netdev user,id=net0 -device virtio-net-pci,netdev=net0,romfile= \
            </dev/null >"$tmp/$label.console" 2>&1 || { echo "$label guest: QEMU exited with $?:" >&2; tail -5 "$tmp/$label.console" >&2; }
        tr -d '\r' <"$tmp/$label.console" | grep -E '^(bw|FAIL|flyt:|guest cpu)' >&2 || true
        tr -d '\r' <"$tmp/$label.console" | grep '^bw ' >>"$out" || true
        # The guest's sessions end with QEMU: its region is wiped before the next guest starts.
        sleep 2
    }
    boot tcg 400 -accel tcg
    if [ -w /dev/kvm ]; then boot kvm 120 -accel kvm; else echo "no /dev/kvm: no KVM guest" >&2; fi
    echo "server: $(grep -c 'region wiped' "$tmp/server.err") region wipes; $(grep -c 'session .* opened' "$tmp/server.err") sessions" >&2
    echo "| run | memory | direction | MiB | median GB/s | p90 GB/s |"
    echo "| --- | --- | --- | ---: | ---: | ---: |"
    awk '$1 == "bw" && $5 >= 16777216 { printf "| %s | %s | %s | %d | %s | %s |\n", $2, $3, $4, $5 / 1048576, $6, $7 }' "$out"
}

case ${1:-} in
    pack) pack "${2:?usage: benchmarks/vm-guest-gpu.sh pack DIR}" ;;
    run) shift; run "$@" ;;
    *) echo "usage: benchmarks/vm-guest-gpu.sh pack DIR | run --pack DIR --dist DIR [--reps N]" >&2; exit 2 ;;
esac
