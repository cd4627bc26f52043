#!/usr/bin/env bash
# Diagnostic on the GPU machine: why batch-1 inference (torch_bench.py's launch-bound row) is
# sometimes 1.4 ms and sometimes 2.3 ms in the same run. Repeats the inference alone, natively and
# through Flyt (Unix socket with the shared-memory channel off and on), unpinned and with the app
# and the server pinned to the two hardware threads of one core or to two different cores.
#   benchmarks/diagnostics/torch_infer_spread.sh DIST OUT PYTHON [REPEATS]
set -uo pipefail
source "$(dirname "$0")/common.sh"
python=${3:?a Python with PyTorch}
repeats=${4:-3}
echo "CPUs: $(nproc); core of each CPU:"
for c in /sys/devices/system/cpu/cpu[0-9]*; do
    printf '%s:%s ' "${c##*cpu}" "$(cat "$c/topology/thread_siblings_list")"
done
echo
app_cpu=2
sibling=$(tr ',-' '  ' </sys/devices/system/cpu/cpu$app_cpu/topology/thread_siblings_list | tr ' ' '\n' | grep -vx "$app_cpu" | head -1)
other=6
infer() { # LABEL PREFIX... -- ENV...
    local label=$1
    shift
    for i in $(seq "$repeats"); do
        local line
        line=$(env "$@" "$python" "$here/../torch_bench.py" --infer-only 2>"$tmp/err" | grep torch_infer_b1)
        printf '%-40s %s\n' "$label" "${line:-failed: $(tail -1 "$tmp/err")}"
    done
}
native_env=(LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})
infer "native" "${native_env[@]}"
infer "native pinned cpu $app_cpu" "${native_env[@]}" taskset -c $app_cpu
for placement in free sibling other; do
    if [ "$placement" = sibling ] && [ -z "$sibling" ]; then
        echo "(no hardware-thread sibling of CPU $app_cpu: no SMT here, the sibling placement is skipped)"
        continue
    fi
    case $placement in
        free) server_pin=() app_pin=() ;;
        sibling) server_pin=(taskset -c "$sibling") app_pin=(taskset -c $app_cpu) ;;
        other) server_pin=(taskset -c "$other") app_pin=(taskset -c $app_cpu) ;;
    esac
    rm -f "$tmp/flyt.sock"
    start_server "server-$placement" --device cuda --listen "unix:$tmp/flyt.sock" || exit 1
    # The listener runs as the server's child of start_server; pin it and, through fork, its workers.
    server_pid=$(pgrep -n -f "flyt-rpc-server --device cuda --listen unix:$tmp/flyt.sock")
    [ ${#server_pin[@]} -gt 0 ] && taskset -a -p -c "${server_pin[2]}" "$server_pid" >/dev/null
    for shm in off on; do
        infer "flyt shm=$shm $placement (app ${app_pin[2]:-any}, server ${server_pin[2]:-any})" \
            FLYT_SERVER=unix:$tmp/flyt.sock FLYT_SHM=$shm LD_LIBRARY_PATH=$dist/lib "${app_pin[@]}"
    done
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null
done
