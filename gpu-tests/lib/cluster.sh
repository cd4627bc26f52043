# What the gpu-tests scripts that start Flyt's control plane share. Source it after setting the
# defaults DIST OUT NVCC ARCH LIMIT; the script defines fail() (prints its name and the reason,
# exits 1), TMP (its scratch folder) and daemons=() (the pids stop_daemons stops).

# shellcheck source=options.sh
. "$(dirname "${BASH_SOURCE[0]}")/options.sh"

gpu_test_usage() {
    echo "usage: $0 --dist DIR --out DIR [--nvcc PATH] [--arch SM] [--timeout S]" >&2
    exit 2
}

# parse_gpu_test_args "$@": --dist --out --nvcc --arch --timeout into DIST OUT NVCC ARCH LIMIT, then
# DIST and OUT made absolute (OUT created).
parse_gpu_test_args() {
    parse_options gpu_test_usage --dist=DIST --out=OUT --nvcc=NVCC --arch=ARCH --timeout=LIMIT -- "$@"
    absolute_dist_out
}

# gpu_test_start NAME N "$@": the start of the scripts that take parse_gpu_test_args' options:
# the command line read, N GPUs or more here (need_gpus), TMP made (/tmp/flyt-NAME.*), no
# daemons yet.
gpu_test_start() {
    local name=$1 gpus=$2
    shift 2
    parse_gpu_test_args "$@"
    need_gpus "$name" "$gpus"
    TMP=$(mktemp -d "/tmp/flyt-$name.XXXXXX")
    daemons=()
}

# need_gpus NAME N: exits 2 (saying so) unless this machine has N GPUs or more.
need_gpus() {
    if [ "$(nvidia-smi -L | wc -l)" -lt "$2" ]; then
        echo "$1: needs $2 GPUs here" >&2
        exit 2
    fi
}

# stop_daemons: newest first (the client manager, the node managers, which stop their
# rpc-servers, the cluster manager), each given 10 s after SIGTERM before SIGKILL.
stop_daemons() {
    local i
    for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do
        kill -TERM "${daemons[i]}" 2>/dev/null
        for _ in $(seq 100); do kill -0 "${daemons[i]}" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "${daemons[i]}" 2>/dev/null
    done
}

# start_daemon NAME COMMAND...: a daemon, its stdout in $TMP/NAME.out, its log in $OUT/NAME.log;
# its ready line (the first of its stdout) in LINE, within 60 s (not run in a subshell, so that
# stop_daemons knows it).
start_daemon() {
    local name=$1
    shift
    "$@" >"$TMP/$name.out" 2>"$OUT/$name.log" &
    daemons+=($!)
    LINE=
    for _ in $(seq 600); do
        [ -s "$TMP/$name.out" ] && { LINE=$(head -n 1 "$TMP/$name.out"); break; }
        kill -0 "${daemons[-1]}" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$LINE" ] || fail "$name did not start (log: $OUT/$name.log)"
}

# start_cluster_manager: a cluster key in $TMP/cluster.key, flytctl's environment exported and its
# path in flytctl, a cluster manager (embedded store) started, its address in cluster.
start_cluster_manager() {
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/cluster.key"
    chmod 600 "$TMP/cluster.key"
    export FLYTCTL_ADMIN_SOCKET="$TMP/admin.sock" FLYTCTL_CLUSTER_KEY_FILE="$TMP/cluster.key"
    flytctl="$DIST/bin/flytctl"
    FLYT_CLUSTER_MANAGER_LISTEN=127.0.0.1:0 FLYT_CLUSTER_MANAGER_ADMIN_SOCKET="$TMP/admin.sock" \
        FLYT_CLUSTER_MANAGER_CLUSTER_KEY_FILE="$TMP/cluster.key" FLYT_CLUSTER_MANAGER_STATE_DIR="$TMP/cluster-manager" \
        start_daemon cluster-manager "$DIST/bin/flyt-cluster-manager"
    cluster=$(echo "$LINE" | awk '{print $4}')
}

# start_node_manager NAME GPUS HOST_IP: a node manager of the cluster seeing GPUS
# (CUDA_VISIBLE_DEVICES), starting its own rpc-servers on the real device (NODE_DEVICE=emulated:
# the emulated one, FLYT_NODE_MANAGER_EMULATED_GPUS from the environment).
start_node_manager() {
    CUDA_VISIBLE_DEVICES=$2 FLYT_NODE_MANAGER_NODE_ID=$1 FLYT_NODE_MANAGER_CLUSTER_MANAGER="$cluster" \
        FLYT_NODE_MANAGER_HOST_IP=$3 FLYT_NODE_MANAGER_ADVERTISE_HOST=127.0.0.1 FLYT_NODE_MANAGER_CONTROL_LISTEN=127.0.0.1:0 \
        FLYT_NODE_MANAGER_CLUSTER_KEY_FILE="$TMP/cluster.key" FLYT_NODE_MANAGER_STATE_DIR="$TMP/$1" FLYT_NODE_MANAGER_DEVICE="${NODE_DEVICE:-cuda}" \
        FLYT_NODE_MANAGER_RPC_SERVER_BINARY="$DIST/bin/flyt-rpc-server" FLYT_NODE_MANAGER_RPC_SERVER_LISTEN_HOST=127.0.0.1 \
        FLYT_NODE_MANAGER_RPC_SERVER_SOCKET_DIR="$TMP/$1-sockets" FLYT_NODE_MANAGER_MPS_ENABLED=false \
        start_daemon "$1" "$DIST/bin/flyt-node-manager"
}

# wait_for_registered_gpus N: waits up to 30 s for the cluster's nodes that are up to hold N GPUs
# in all; the last count seen in REGISTERED; false when it never came to N.
wait_for_registered_gpus() {
    for _ in $(seq 300); do
        REGISTERED=$("$flytctl" list-servernodes --json 2>/dev/null | python3 -c 'import json,sys; print(sum(len(v["gpus"]) for v in json.load(sys.stdin) if v["node"]["health"] == "Up"))' 2>/dev/null)
        [ "$REGISTERED" = "$1" ] && return 0
        sleep 0.1
    done
    return 1
}

# start_client_manager: the VM's client manager (VM IP 127.0.0.1) on $TMP/client-manager.sock
# (more of its settings, e.g. FLYT_CLIENT_MANAGER_JOB_SOCKET, from the environment).
start_client_manager() {
    FLYT_CLIENT_MANAGER_VM_IP=127.0.0.1 FLYT_CLIENT_MANAGER_CLUSTER_MANAGER="$cluster" FLYT_CLIENT_MANAGER_CLUSTER_KEY_FILE="$TMP/cluster.key" \
        FLYT_CLIENT_MANAGER_SOCKET="$TMP/client-manager.sock" start_daemon client-manager "$DIST/bin/flyt-client-manager"
}

# stop_servers_and_clean: the EXIT trap of the scripts that start rpc-servers themselves (their
# pids in servers): stops them and removes TMP.
stop_servers_and_clean() {
    for pid in "${servers[@]}"; do kill "$pid" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$TMP"
}

# compare_row LABEL NAME FLYT_RC: a row of the table of runs: $OUT/NAME.out, the Flyt run's output
# (its exit status FLYT_RC), against $OUT/native.out (native_rc); rc=1 unless both passed alike.
compare_row() {
    local same=no
    cmp -s "$OUT/native.out" "$OUT/$2.out" && same=yes
    { [ "$native_rc" = 0 ] && [ "$3" = 0 ] && [ $same = yes ]; } || rc=1
    echo "| $1 | $(tail -1 "$OUT/native.out") (rc $native_rc) | $(tail -1 "$OUT/$2.out") (rc $3) | $same |"
}
