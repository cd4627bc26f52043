#!/usr/bin/env bash
# Issue 48 on a GPU machine without Slurm: `srun --flyt-gpus=1` runs a PyTorch job through Flyt,
# the GPU hidden from the job. From Debian's Slurm and munge packed by tools/slurm-bundle
# (--slurm: the unpacked folder) and Flyt's release build (--dist), all under one temp folder:
#   1. the job alone, natively (gpu-tests/frameworks/slurm_torch.py, deterministic);
#   2. a Flyt cluster: cluster manager (embedded store), a node manager serving GPU 0 (its own
#      rpc-server, outside the hiding), the node's client manager with its job socket;
#   3. munged, slurmctld and slurmd (slurmd and so its jobs in a mount namespace where the GPU's
#      device nodes and the driver's libraries are hidden: gpu-tests/tools/hide_gpu.c), Flyt's
#      SPANK plugin in plugstack.conf, `flytctl slurm sync` for the licenses;
#   4. `srun --flyt-gpus=1 PYTHON slurm_torch.py`: its stdout must be the native run's, the
#      libcuda it mapped Flyt's only, no GPU device node usable, the job's AdminComment naming its
#      allocation, and the allocation gone within 10 s of the job's end.
# With --device emulated (no GPU, no PyTorch: a machine like CI's), --app runs instead of the
# Python job (e.g. cluster-manager/tests/slurm/app.c built against dist/lib) and its output
# must contain --expect.
#   gpu-tests/slurm-torch.sh --dist DIR --slurm DIR --out DIR [--python P] [--device cuda|emulated]
#                            [--app 'CMD ARGS'] [--expect TEXT] [--timeout S]
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIST= SLURM= OUT= PYTHON=/opt/torch/.venv/bin/python3 DEVICE=cuda APP= EXPECT= LIMIT=300
usage() {
    sed -n '2,19p' "${BASH_SOURCE[0]}" >&2
    exit 2
}
# shellcheck source=lib/options.sh
. "$here/lib/options.sh"
parse_options usage --dist=DIST --slurm=SLURM --out=OUT --python=PYTHON --device=DEVICE --app=APP --expect=EXPECT \
    --timeout=LIMIT -- "$@"
[ -n "$DIST" ] && [ -n "$SLURM" ] && [ -n "$OUT" ] || usage
[ "$(id -u)" = 0 ] || { echo "slurm-torch: needs root (Slurm's daemons launch the jobs)" >&2; exit 2; }
DIST=$(cd "$DIST" && pwd) SLURM=$(cd "$SLURM" && pwd)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
[ -n "$APP" ] || APP="$PYTHON $here/frameworks/slurm_torch.py"
TMP=$(mktemp -d /tmp/flyt-slurm-torch.XXXXXX)
chmod 755 "$TMP"
daemons=()
fail() { echo "slurm-torch: $*" >&2; exit 1; }
. "$here/lib/cluster.sh"
# Slurm from the bundle (its programs find their libraries by RUNPATH: nothing to set).
export SLURM_CONF=$TMP/slurm.conf

cleanup() {
    "$SLURM/bin/scancel" --full --user=root >/dev/null 2>&1
    stop_daemons
    wait 2>/dev/null
    # The rpc-server of an allocation released at the job's end finishes its stop (the sessions'
    # grace) on its own, past its node manager: waited for (bounded), then stopped.
    if command -v pgrep >/dev/null; then
        for _ in $(seq 150); do pgrep -f -- "$TMP/" >/dev/null || break; sleep 0.1; done
        local left
        left=$(pgrep -f -- "$TMP/" | tr '\n' ' ')
        if [ -n "$left" ]; then
            echo "slurm-torch: still running 15 s after their daemons: $(ps -o pid=,args= -p "${left// /,}" | cut -c1-120 | tr '\n' ';')" >&2
            kill -KILL $left 2>/dev/null
        fi
    fi
    # The cgroup folders slurmd made, deepest first (empty once its daemons are gone).
    for _ in $(seq 50); do
        [ -n "${made_slice:-}" ] && [ -d "$made_slice" ] || break
        find "$made_slice" -depth -type d -exec rmdir {} + 2>/dev/null
        sleep 0.1
    done
    [ -n "${made_slice:-}" ] && [ -d "$made_slice" ] && echo "slurm-torch: $made_slice left behind: $(find "$made_slice" -name cgroup.procs -exec cat {} + | tr '\n' ' ')" >&2
    cp "$TMP"/log/* "$OUT/" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
# until SECONDS WHAT COMMAND...: waits (bounded) for COMMAND to succeed.
until_ok() {
    local limit=$1 what=$2
    shift 2
    for _ in $(seq $((limit * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    fail "$what: not within $limit s"
}

# 1. Natively.
native_rc=-
if [ "$DEVICE" = cuda ]; then
    CUDA_VISIBLE_DEVICES=0 timeout "$LIMIT" $APP >"$OUT/native.out" 2>"$OUT/native.err"
    native_rc=$?
fi

# 2. Flyt.
start_cluster_manager
flytctl() { PATH="$SLURM/bin:$PATH" "$DIST/bin/flytctl" "$@"; }
NODE_DEVICE=$DEVICE FLYT_NODE_MANAGER_EMULATED_GPUS='[{ name = "Emulated node-a", memory_mib = 4096, sm_count = 40 }]' \
    start_node_manager node-a 0 127.0.0.1
node_up() {
    flytctl list-servernodes --json | python3 -c 'import json,sys; sys.exit(not any(v["node"]["health"] == "Up" and v["gpus"] for v in json.load(sys.stdin)))'
}
until_ok 60 "the node manager up" node_up
FLYT_CLIENT_MANAGER_JOB_SOCKET="$TMP/jobs.sock" start_client_manager
until_ok 30 "the job socket" test -S "$TMP/jobs.sock"

# 3. Slurm.
mkdir -p "$TMP/munge" "$TMP/state" "$TMP/spool" "$TMP/log"
head -c 1024 /dev/urandom >"$TMP/munge/munge.key"
chmod 700 "$TMP/munge" && chmod 400 "$TMP/munge/munge.key"
"$SLURM/sbin/munged" -F -f --socket="$TMP/munge/socket" --key-file="$TMP/munge/munge.key" \
    --pid-file="$TMP/munge/munged.pid" --log-file="$TMP/log/munged.log" --seed-file="$TMP/munge/seed" </dev/null >/dev/null 2>&1 &
daemons+=($!)
until_ok 10 "munged's socket" test -S "$TMP/munge/socket"
echo "required $DIST/slurm/libflyt_spank.so lib_dir=$DIST/lib socket=$TMP/jobs.sock timeout=60 slurm_conf=$TMP/slurm.conf scontrol=$SLURM/bin/scontrol" >"$TMP/plugstack.conf"
cp "$DIST/slurm/cli_filter.lua" "$TMP/"
host=$(hostname -s)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cat >"$SLURM_CONF" <<CONF
ClusterName=flytgpu
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(port)
SlurmdPort=$(port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$TMP/munge/socket
CredType=cred/munge
PluginDir=$SLURM/slurm-wlm
StateSaveLocation=$TMP/state
SlurmdSpoolDir=$TMP/spool
SlurmctldPidFile=$TMP/slurmctld.pid
SlurmdPidFile=$TMP/slurmd.pid
SlurmctldLogFile=$TMP/log/slurmctld.log
SlurmdLogFile=$TMP/log/slurmd.log
SlurmdDebug=verbose
PlugStackConfig=$TMP/plugstack.conf
CliFilterPlugins=cli_filter/lua
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=2
InactiveLimit=0
MinJobAge=600
NodeName=flytnode NodeHostname=$host NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=flytnode Default=YES MaxTime=INFINITE State=UP
CONF
# A machine with cgroup v2 and no systemd (no D-Bus): slurmd makes its cgroup folders itself,
# under system.slice, which only systemd would have made (removed again at the end).
printf 'CgroupPlugin=autodetect\nIgnoreSystemdOnFailure=yes\n' >"$TMP/cgroup.conf"
made_slice=
if [ -f /sys/fs/cgroup/cgroup.controllers ] && [ ! -d /sys/fs/cgroup/system.slice ]; then
    mkdir /sys/fs/cgroup/system.slice && made_slice=/sys/fs/cgroup/system.slice
fi
"$SLURM/sbin/slurmctld" -D -i -f "$SLURM_CONF" </dev/null >/dev/null 2>"$TMP/log/slurmctld.stderr" &
daemons+=($!)
# The GPU hidden from slurmd and so from its jobs: device nodes and the driver's libcuda files.
cc -O2 -o "$TMP/hide_gpu" "$here/tools/hide_gpu.c" || fail "cc hide_gpu failed"
: >"$TMP/hide.list"
for d in /dev/nvidia*; do [ -c "$d" ] && echo "bind $d" >>"$TMP/hide.list"; done
# The driver's libcuda and libnvidia-ml files wherever the loader could find them: the loader
# cache's folders (ldconfig is in /sbin, which a bare PATH lacks), the usual ones and
# LD_LIBRARY_PATH's (jobs inherit srun's), as gpu-tests/run.sh hides them; Flyt's own kept.
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
lib_dirs=($("$ldconfig" -p 2>/dev/null | awk '/libcuda\.so|libnvidia-ml\.so/ {print $NF}' | xargs -r -n1 dirname)
    /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/nvidia/lib64
    /usr/local/nvidia/lib /usr/local/cuda/compat)
IFS=: read -r -a ld_dirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${lib_dirs[@]}" "${ld_dirs[@]}"; do
    [ -n "$d" ] && [ -d "$d" ] && [ "$(readlink -f "$d")" != "$DIST/lib" ] || continue
    for f in "$d"/libcuda.so* "$d"/libnvidia-ml.so*; do [ -e "$f" ] && echo "bind $(readlink -f "$f")"; done
done >>"$TMP/hide.list"
sort -u -o "$TMP/hide.list" "$TMP/hide.list"
# On a GPU the driver's libcuda must be among the hidden, or the job could reach the GPU natively.
[ "$DEVICE" != cuda ] || grep -q '/libcuda\.so' "$TMP/hide.list" || fail "no driver libcuda found to hide"
"$TMP/hide_gpu" "$TMP/hide.list" -- "$SLURM/sbin/slurmd" -D -N flytnode -f "$SLURM_CONF" -d "$SLURM/sbin/slurmstepd" \
    </dev/null >/dev/null 2>"$TMP/log/slurmd.stderr" &
daemons+=($!)
node_idle() { "$SLURM/bin/scontrol" show node flytnode | grep -q "State=IDLE"; }
until_ok 60 "the Slurm node idle" node_idle
flytctl slurm sync --slurm-conf "$SLURM_CONF" >"$OUT/sync.txt" 2>&1 || fail "flytctl slurm sync: $(cat "$OUT/sync.txt")"

# 4. The job through Flyt.
cd "$TMP" || fail "no $TMP"
timeout "$LIMIT" "$SLURM/bin/srun" --flyt-gpus=1 --job-name=torch $APP >"$OUT/flyt.out" 2>"$OUT/flyt.err"
flyt_rc=$?
job=$("$SLURM/bin/squeue" -h --states=all -n torch -o %i | head -1)
"$SLURM/bin/scontrol" show job "$job" >"$OUT/job.txt" 2>&1
job_allocations() {
    flytctl list-virt-servers --json | python3 -c 'import json,sys; print(sum(a["vm_ip"].startswith("job-") for a in json.load(sys.stdin)))'
}
released=no
for _ in $(seq 100); do [ "$(job_allocations)" = 0 ] && { released=yes; break; }; sleep 0.1; done
rc=0
if [ "$DEVICE" = cuda ]; then
    same=no
    cmp -s "$OUT/native.out" "$OUT/flyt.out" && same=yes
    libcuda=$(grep '^libcuda mapped:' "$OUT/flyt.err" | cut -d: -f2 | xargs)
    usable=$(grep '^GPU device nodes usable:' "$OUT/flyt.err" | awk '{print $NF}')
    [ "$native_rc" = 0 ] && [ $flyt_rc = 0 ] && [ $same = yes ] && [ "$libcuda" = "$DIST/lib/libcuda.so.1" ] && [ "$usable" = 0 ] || rc=1
    result="stdout as native: $same (native rc $native_rc, job rc $flyt_rc); job's libcuda: ${libcuda:-none}; GPU device nodes usable in the job: ${usable:-?}"
else
    seen=no
    grep -qF "$EXPECT" "$OUT/flyt.out" && seen=yes
    [ $flyt_rc = 0 ] && [ $seen = yes ] || rc=1
    result="job rc $flyt_rc, its output has '$EXPECT': $seen"
fi
comment=$(grep -o 'AdminComment=flyt: [^ ]* [^ ]*' "$OUT/job.txt" | head -1)
[ -n "$comment" ] && [ $released = yes ] || rc=1
echo "| check | result |"
echo "| --- | --- |"
echo "| srun --flyt-gpus=1 ($DEVICE) | $([ $rc = 0 ] && echo PASS || echo FAIL): $result |"
echo "| the job's record | ${comment:-no AdminComment}; allocation released within 10 s of the end: $released |"
echo "| licenses | $(tr '\n' ' ' <"$OUT/sync.txt") |"
exit $rc
