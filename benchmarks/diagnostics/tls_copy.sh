#!/usr/bin/env bash
# Diagnostic on the GPU machine: 256 MiB copies over plain TCP and over TCP under TLS against one
# flyt-rpc-server each, with a whole-machine CPU profile of the TLS run when perf is there.
#   benchmarks/diagnostics/tls_copy.sh DIST OUT
set -uo pipefail
dist=$(cd "${1:?dist folder}" && pwd)
out=${2:?output folder}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
cc -O2 -o "$tmp/tls_copy" "$here/tls_copy.c" -I"$cuda/include" -L"$cuda/lib64/stubs" -lcuda || exit 1
"$dist/bin/flytctl" tls-init --dir "$tmp/tls" --name 127.0.0.1 >/dev/null || exit 1
start() { # port [tls args]
    "$dist/bin/flyt-rpc-server" --device cuda --listen "127.0.0.1:$1" "${@:2}" >"$tmp/$1.out" 2>"$tmp/$1.err" </dev/null &
    for _ in $(seq 100); do grep -q listening "$tmp/$1.out" 2>/dev/null && return 0; sleep 0.1; done
    echo "server on $1 did not start"; cat "$tmp/$1.err"; return 1
}
start 47001 && start 47002 --tls-cert "$tmp/tls/cert.pem" --tls-key "$tmp/tls/key.pem" || exit 1
flyt() { FLYT_SERVER=127.0.0.1:$1 FLYT_SHM=off LD_LIBRARY_PATH=$dist/lib "${@:2}"; }
echo "== native"; "$tmp/tls_copy" 3
echo "== tcp"; flyt 47001 "$tmp/tls_copy" 3
echo "== tcp + tls"; FLYT_TLS_CA=$tmp/tls/ca.pem flyt 47002 "$tmp/tls_copy" 3
if command -v perf >/dev/null; then
    echo "== perf profile of the TLS run (whole machine)"
    FLYT_TLS_CA=$tmp/tls/ca.pem flyt 47002 "$tmp/tls_copy" 12 >/dev/null &
    sleep 2
    perf record -a -g -o "$tmp/perf.data" -- sleep 3 >/dev/null 2>&1
    wait
    perf report -i "$tmp/perf.data" --no-children --sort comm,dso,sym --percent-limit 1 --stdio 2>/dev/null |
        grep -E '^ +[0-9]' | head -40 | tee "$out/perf-tls.txt"
else
    echo "(no perf)"
fi
