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

# start_client_manager: the VM's client manager (VM IP 127.0.0.1) on $TMP/client-manager.sock
# (more of its settings, e.g. FLYT_CLIENT_MANAGER_JOB_SOCKET, from the environment).
start_client_manager() {
    FLYT_CLIENT_MANAGER_VM_IP=127.0.0.1 FLYT_CLIENT_MANAGER_CLUSTER_MANAGER="$cluster" FLYT_CLIENT_MANAGER_CLUSTER_KEY_FILE="$TMP/cluster.key" \
        FLYT_CLIENT_MANAGER_SOCKET="$TMP/client-manager.sock" start_daemon client-manager "$DIST/bin/flyt-client-manager"
}
