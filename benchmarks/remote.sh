#!/usr/bin/env bash
# The remote path at a real network's round trip: the app in one network namespace, its
# flyt-rpc-server in another, joined by a veth pair (10.201.0.2 <-> 10.201.0.1, addresses inside
# namespaces this script makes and deletes), with a delay each way made by netem (`tc qdisc ...
# netem delay D` on both ends) for each D of --delays. For each delay: the raw TCP round trip
# (a Python ping-pong over the same pair), empty launch + sync (benchmarks/micro.cu), 64 MiB
# pinned and pageable copies (benchmarks/copy.cu), and a GPT-2-small training step and greedy
# decoding (benchmarks/gpt2_remote.py); the same programs natively first. Where the kernel has no
# netem, the delay comes from benchmarks/delay_relay.c, a TCP relay in the server's namespace that
# holds every chunk for the delay in each direction (the table says which). The app's library path points at Flyt's (the
# GPU is not hidden from it: it is in another network namespace, not another mount namespace).
# Namespaces need root and ip(8): without them the script says so and runs app, relay and server
# on the loopback interface, the delay then coming from the relay alone. Results:
# OUT/remote.jsonl (one JSON object per line, with "delay" and "mode"), then a table.
#   benchmarks/remote.sh --dist DIR --out DIR [--python P] [--delays 0,50us,200us,1ms] [--only micro,copy,gpt2]
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIST=$here/../dist OUT=/tmp/flyt-remote PY=/opt/torch/.venv/bin/python3 DELAYS=0,50us,200us,1ms ONLY=micro,copy,gpt2
usage() {
    echo "usage: $0 --dist DIR --out DIR [--python P] [--delays 0,50us,200us,1ms] [--only micro,copy,gpt2]" >&2
    exit 2
}
# shellcheck source=../gpu-tests/lib/options.sh
. "$here/../gpu-tests/lib/options.sh"
parse_options usage --dist=DIST --out=OUT --python=PY --delays=DELAYS --only=ONLY -- "$@"
# Without iproute2 (or root) there are no namespaces: app, relay and server share the loopback
# interface and the delay comes from the relay alone (the table says so).
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
    where=namespaces
else
    where="loopback (no network namespaces here: $([ "$(id -u)" = 0 ] && echo 'no ip(8)' || echo 'not root'))"
fi
absolute_dist_out
: >"$OUT/remote.jsonl"
wants() { [[ ",$ONLY," == *",$1,"* ]]; }

TMP=$(mktemp -d /tmp/flyt-remote.XXXXXX)
app=flyt-app-$$ srv=flyt-srv-$$ app_if=fa$$ srv_if=fs$$
server=
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null
    wait 2>/dev/null
    if [ "$where" = namespaces ]; then
        ip netns del "$app" 2>/dev/null
        ip netns del "$srv" 2>/dev/null
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
# in_app / in_srv: the prefix that runs a command on the app's / the server's side.
in_app=() in_srv=() srv_ip=127.0.0.1
[ "$where" != namespaces ] || {
    in_app=(ip netns exec "$app") in_srv=(ip netns exec "$srv") srv_ip=10.201.0.1
    ip netns add "$app" && ip netns add "$srv" &&
        ip link add "$app_if" type veth peer name "$srv_if" &&
        ip link set "$app_if" netns "$app" && ip link set "$srv_if" netns "$srv" &&
        ip -n "$app" addr add 10.201.0.2/24 dev "$app_if" && ip -n "$srv" addr add 10.201.0.1/24 dev "$srv_if" &&
        ip -n "$app" link set lo up && ip -n "$srv" link set lo up &&
        ip -n "$app" link set "$app_if" up && ip -n "$srv" link set "$srv_if" up ||
        { echo "remote.sh: could not make the namespaces and their veth pair" >&2; exit 1; }
}

nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
${CC:-cc} -O2 -pthread -o "$TMP/delay_relay" "$here/delay_relay.c" || { echo "remote.sh: delay_relay build failed" >&2; exit 1; }
"$nvcc" -O2 -arch=sm_90 -o "$TMP/micro" "$here/micro.cu" && "$nvcc" -O2 -arch=sm_90 -o "$TMP/copy" "$here/copy.cu" ||
    { echo "remote.sh: build failed" >&2; exit 1; }

"${in_srv[@]}" "$DIST/bin/flyt-rpc-server" --device cuda $([ "$where" = namespaces ] && echo --listen "$srv_ip:47700") --listen 127.0.0.1:47700 >"$TMP/server.out" 2>"$OUT/server.log" &
server=$!
for _ in $(seq 100); do grep -q 'listening on' "$TMP/server.out" 2>/dev/null && break; sleep 0.1; done

# tag DELAY MODE: adds "delay" and "mode" to each JSON line read.
tag() { "$PY" -c 'import json,sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        o = json.loads(line); o["delay"] = sys.argv[1]; o["mode"] = sys.argv[2]; print(json.dumps(o))' "$1" "$2"; }

# bench DELAY MODE: every selected program, natively (MODE native) or in the app's namespace.
bench() {
    local delay=$1 mode=$2 run=()
    [ "$mode" = flyt ] && run=("${in_app[@]}" env LD_LIBRARY_PATH="$DIST/lib" FLYT_SERVER="$flyt_at" FLYT_SHM=off)
    if wants micro; then timeout 300 "${run[@]}" "$TMP/micro" --quick | tag "$delay" "$mode" >>"$OUT/remote.jsonl"; fi
    if wants copy; then timeout 300 "${run[@]}" "$TMP/copy" --quick --max-bytes 67108864 | tag "$delay" "$mode" >>"$OUT/remote.jsonl"; fi
    if wants gpt2; then timeout 400 "${run[@]}" "$PY" "$here/gpt2_remote.py" 2>>"$OUT/gpt2.$delay.$mode.err" | tag "$delay" "$mode" >>"$OUT/remote.jsonl"; fi
}

# rtt DELAY: the raw TCP round trip between the namespaces (64-byte ping-pong, TCP_NODELAY).
rtt() {
    "${in_srv[@]}" "$PY" -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 47701)); s.listen(1)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    m = c.recv(64)
    if not m: break
    c.sendall(m)' &
    local echo=$!
    sleep 0.5
    "${in_app[@]}" "$PY" -c '
import json, socket, statistics, sys, time
host, port = sys.argv[1].split(":")
c = socket.create_connection((host, int(port))); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
t = []
for i in range(300):
    a = time.perf_counter(); c.sendall(b"x" * 64); c.recv(64); t.append(time.perf_counter() - a)
t = sorted(t[30:])
print(json.dumps({"bench": "raw_tcp_rtt", "p50_us": round(statistics.median(t) * 1e6, 1), "p99_us": round(t[int(len(t) * 0.99)] * 1e6, 1)}))' "$echo_at" |
        tag "$1" raw >>"$OUT/remote.jsonl"
    kill "$echo" 2>/dev/null
    wait "$echo" 2>/dev/null
}

# microseconds DELAY: 50us -> 50, 1ms -> 1000, 0 -> 0.
microseconds() {
    case $1 in
        *us) echo "${1%us}" ;;
        *ms) echo $((${1%ms} * 1000)) ;;
        *) echo "$1" ;;
    esac
}

bench 0 native
delayed_by=netem
if [ "$where" != namespaces ]; then
    delayed_by="benchmarks/delay_relay.c"
elif ! tc -n "$app" qdisc replace dev "$app_if" root netem delay 1us 2>"$TMP/tc.err"; then
    delayed_by="benchmarks/delay_relay.c (no netem here: $(head -n 1 "$TMP/tc.err"))"
else
    tc -n "$app" qdisc del dev "$app_if" root 2>/dev/null
fi
IFS=, read -r -a delays <<<"$DELAYS"
for delay in "${delays[@]}"; do
    relays=()
    flyt_at=$srv_ip:47700 echo_at=$srv_ip:47701
    if [ "$delay" != 0 ]; then
        if [ "$delayed_by" = netem ]; then
            tc -n "$app" qdisc replace dev "$app_if" root netem delay "$delay" && tc -n "$srv" qdisc replace dev "$srv_if" root netem delay "$delay"
        else
            us=$(microseconds "$delay")
            "${in_srv[@]}" "$TMP/delay_relay" "$srv_ip:47710" 127.0.0.1:47700 "$us" >/dev/null &
            relays+=($!)
            "${in_srv[@]}" "$TMP/delay_relay" "$srv_ip:47711" 127.0.0.1:47701 "$us" >/dev/null &
            relays+=($!)
            flyt_at=$srv_ip:47710 echo_at=$srv_ip:47711
            sleep 0.3
        fi
    fi
    rtt "$delay"
    # Decoding drifts with the host's CPU: each delay's ratio is against a native run just before.
    if wants gpt2 && [ "$delay" != 0 ]; then
        timeout 400 "$PY" "$here/gpt2_remote.py" --decode-only 2>>"$OUT/gpt2.$delay.native.err" | tag "$delay" native >>"$OUT/remote.jsonl"
    fi
    bench "$delay" flyt
    if [ ${#relays[@]} -gt 0 ]; then
        kill "${relays[@]}" 2>/dev/null
        wait "${relays[@]}" 2>/dev/null
    fi
    if [ "$delay" != 0 ] && [ "$delayed_by" = netem ]; then
        tc -n "$app" qdisc del dev "$app_if" root 2>/dev/null
        tc -n "$srv" qdisc del dev "$srv_if" root 2>/dev/null
    fi
done

echo "# remote: app and server in $([ "$where" = namespaces ] && echo 'two network namespaces over veth' || echo "$where"), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); delays by $delayed_by"
"$PY" - "$OUT/remote.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def pick(delay, mode, bench, key, **match):
    for r in rows:
        if r.get("delay") == delay and r.get("mode") == mode and r.get("bench") == bench and all(r.get(k) == v for k, v in match.items()):
            return r.get(key)
    return None
delays = []
for r in rows:
    if r["mode"] != "native" and r["delay"] not in delays:
        delays.append(r["delay"])
print("| delay each way | raw TCP RTT p50 | launch+sync p50 (native) | 64 MiB pinned H2D / D2H GB/s (native) | GPT-2 step ms (ratio) | decode ms/token (ratio) |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
def fmt(x, f="{:.1f}"):
    return "-" if x is None else f.format(x)
for d in delays:
    rtt = pick(d, "raw", "raw_tcp_rtt", "p50_us")
    ls = pick(d, "flyt", "launch_sync", "p50_us"); lsn = pick("0", "native", "launch_sync", "p50_us")
    keys = [r for r in rows if r.get("bench") == "copy" and r.get("delay") == d and r.get("mode") == "flyt" and r.get("bytes") == 67108864]
    keys_n = [r for r in rows if r.get("bench") == "copy" and r.get("mode") == "native" and r.get("bytes") == 67108864]
    def gbs(rs, direction, memory):
        for r in rs:
            if r.get("dir") == direction and r.get("mem") == memory:
                return r.get("gbps")
    step = pick(d, "flyt", "gpt2_train_step", "p50_ms"); stepn = pick("0", "native", "gpt2_train_step", "p50_ms")
    dec = pick(d, "flyt", "gpt2_decode", "ms_per_token")
    decn = pick(d, "native", "gpt2_decode", "ms_per_token") or pick("0", "native", "gpt2_decode", "ms_per_token")
    ratio = lambda a, b: "-" if a is None or not b else f"{a:.2f} ({a / b:.2f}x)"
    print(f"| {d} | {fmt(rtt)} us | {fmt(ls)} us ({fmt(lsn)}) | {fmt(gbs(keys, 'H2D', 'pinned'))} / {fmt(gbs(keys, 'D2H', 'pinned'))} ({fmt(gbs(keys_n, 'H2D', 'pinned'))} / {fmt(gbs(keys_n, 'D2H', 'pinned'))}) | {ratio(step, stepn)} | {ratio(dec, decn)} |")
EOF
