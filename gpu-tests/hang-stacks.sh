#!/usr/bin/env bash
# gpu-tests/hang-stacks.sh DIST OUT TRANSPORT SECONDS -- COMMAND [ARG...]
# Runs COMMAND through Flyt (a flyt-rpc-server of DIST on this machine; TRANSPORT tcp, unix or
# shm) and, if it is still running after SECONDS, writes the stacks of every thread of the app
# and of its session's worker (cuda-gdb, or gdb where there is one) to OUT/stacks.txt, then stops
# both. For finding where a program that hangs through Flyt waits. OUT also gets the app's output
# (app.out, app.err) and the server's log (server.log). FLYT_TRACE=errors is set for the app.
set -uo pipefail
dist=$(cd "${1:?usage: hang-stacks.sh DIST OUT TRANSPORT SECONDS -- COMMAND...}" && pwd)
out=${2:?}; transport=${3:?}; seconds=${4:?}
shift 4
[ "${1:-}" = -- ] && shift
mkdir -p "$out"
tmp=$(mktemp -d)
debugger=$(command -v gdb || command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
listen=(--listen "unix:$tmp/flyt.sock")
[ "$transport" = tcp ] && listen=(--listen 127.0.0.1:0)
setsid "$dist/bin/flyt-rpc-server" --device cuda "${listen[@]}" >"$tmp/server.out" 2>"$out/server.log" </dev/null &
server=$!
for _ in $(seq 100); do grep -q 'listening on' "$tmp/server.out" 2>/dev/null && break; sleep 0.1; done
address=$(sed -n 's/^flyt-rpc-server listening on //p' "$tmp/server.out" | head -n 1)
shm=off
[ "$transport" = shm ] && shm=on
LD_LIBRARY_PATH="$dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FLYT_SERVER=$address FLYT_SHM=$shm FLYT_TRACE=errors \
    TRITON_LIBCUDA_PATH="$dist/lib" "$@" >"$out/app.out" 2>"$out/app.err" </dev/null &
app=$!
waited=0
while kill -0 "$app" 2>/dev/null && [ "$waited" -lt "$seconds" ]; do sleep 1; waited=$((waited + 1)); done
if kill -0 "$app" 2>/dev/null; then
    worker=$(sed -n 's/.*session [0-9]* opened: .*worker=\([0-9]*\).*/\1/p' "$out/server.log" | tail -n 1)
    {
        echo "still running after $seconds s; stacks by $debugger"
        for pid in "$app" $(pgrep -P "$app") $worker; do
            echo "===== pid $pid: $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-200)"
            timeout 60 "$debugger" -p "$pid" -batch -ex "set pagination off" -ex "thread apply all bt 30" 2>&1 |
                grep -E '^(Thread|#[0-9]+ )' | cut -c1-300
        done
    } >"$out/stacks.txt" 2>&1
    kill -9 "$app" $(pgrep -P "$app") 2>/dev/null
    echo "hang-stacks: the app hung; stacks in $out/stacks.txt"
else
    wait "$app"
    echo "hang-stacks: the app exited $? within $seconds s"
fi
kill "$server" 2>/dev/null
sleep 1
pkill -9 -f "$tmp/flyt.sock" 2>/dev/null
rm -rf "$tmp"
