# The prologue the diagnostics share, sourced with the script's own arguments DIST OUT first:
# sets dist, out (made), here, cuda and tmp (removed at exit, with the background jobs).
dist=$(cd "${1:?dist folder}" && pwd)
out=${2:?output folder}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT

# Compiles $here/NAME.c, a driver-API probe, into $tmp/NAME.
build_probe() { # NAME
    cc -O2 -o "$tmp/$1" "$here/$1.c" -I"$cuda/include" -L"$cuda/lib64/stubs" -lcuda
}

# Starts flyt-rpc-server with ARGS (its output in $tmp/NAME.out and .err) and waits until it listens.
start_server() { # NAME ARGS...
    local name=$1
    shift
    "$dist/bin/flyt-rpc-server" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null &
    for _ in $(seq 100); do grep -q listening "$tmp/$name.out" 2>/dev/null && return 0; sleep 0.1; done
    echo "server $name did not start"
    cat "$tmp/$name.err"
    return 1
}
