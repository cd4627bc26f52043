#!/usr/bin/env bash
# gpu-tests/run.sh: build the gpu-tests CUDA programs, run each natively and through Flyt (one
# flyt-rpc-server on this machine, over TCP loopback and a Unix socket), compare stdout and exit
# status, and print a table. Plain bash + coreutils; run it on the GPU machine. See README.md.
set -uo pipefail

usage() {
    cat <<'EOF'
usage: gpu-tests/run.sh [options]
  --dist DIR          Flyt binaries: DIR/lib/libcudart.so.13 and DIR/bin/flyt-rpc-server (default: dist)
  --arch SM           nvcc -arch value (default: sm_90)
  --transports LIST   comma-separated, from tcp,unix,shm (default: tcp,unix,shm); shm is the Unix
                      socket with the shared-memory channel required (FLYT_SHM=on), tcp and unix
                      run with it off
  --out DIR           results: table.md, log.txt, server.log, build.log (default: gpu-tests/results)
  --only NAME...      run only these programs (file names without .cu; fault_isolation, fault_victim or
                      fault_kernel select the fault-isolation pair); commas also separate names
  --native-only       no Flyt: run every program natively twice and compare the runs (determinism check)
  --build-only        only build the programs (exit 1 if any fails to build)
  --build-dir DIR     where the programs are built (default: gpu-tests/build)
  --device NAME       the server's --device (default: cuda; 'emulated' only checks the plumbing)
  --timeout SECONDS   limit for each program run (default: 120)
  --nvcc PATH         the compiler (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)
Environment: NVCC_FLAGS adds flags to every nvcc command (e.g. -L.cuda/lib to link against a
fetched toolkit).
Exit status: 0 when every row passed, 1 when a row failed, 2 on a usage or setup error.
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
    echo "run.sh: $*" >&2
    exit 2
}
abspath() {
    case $1 in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s\n' "$PWD/$1" ;;
    esac
}

DIST=dist
ARCH=sm_90
TRANSPORTS=tcp,unix,shm
OUT=$here/results
BUILD=$here/build
MODE=flyt
DEVICE=cuda
TIMEOUT=120
NVCC=${NVCC:-}
ONLY=()

need_value() { if [ $# -lt 2 ] || [ -z "$2" ]; then die "$1 needs a value"; fi; }
while [ $# -gt 0 ]; do
    case $1 in
        --dist) need_value "$@"; DIST=$2; shift 2 ;;
        --arch) need_value "$@"; ARCH=$2; shift 2 ;;
        --transports) need_value "$@"; TRANSPORTS=$2; shift 2 ;;
        --out) need_value "$@"; OUT=$2; shift 2 ;;
        --build-dir) need_value "$@"; BUILD=$2; shift 2 ;;
        --device) need_value "$@"; DEVICE=$2; shift 2 ;;
        --timeout) need_value "$@"; TIMEOUT=$2; shift 2 ;;
        --nvcc) need_value "$@"; NVCC=$2; shift 2 ;;
        --native-only) MODE=native; shift ;;
        --build-only) MODE=build; shift ;;
        --only)
            shift
            while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do
                IFS=, read -r -a names <<<"$1"
                ONLY+=("${names[@]}")
                shift
            done
            [ ${#ONLY[@]} -gt 0 ] || die "--only needs at least one name"
            ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
case $TIMEOUT in '' | *[!0-9]*) die "--timeout must be a number of seconds" ;; esac

DIST=$(abspath "$DIST")
OUT=$(abspath "$OUT")
BUILD=$(abspath "$BUILD")

IFS=, read -r -a TRANSPORT_LIST <<<"$TRANSPORTS"
for t in "${TRANSPORT_LIST[@]}"; do
    case $t in tcp | unix | shm) ;; *) die "unknown transport '$t' (tcp, unix, shm)" ;; esac
done
[ ${#TRANSPORT_LIST[@]} -gt 0 ] || die "no transports"

if [ "$MODE" = flyt ]; then
    [ -f "$DIST/lib/libcudart.so.13" ] || die "$DIST/lib/libcudart.so.13 not found (--dist)"
    [ -x "$DIST/bin/flyt-rpc-server" ] || die "$DIST/bin/flyt-rpc-server not found or not executable (--dist)"
fi

# ---- programs ----------------------------------------------------------------------------------
# The fault-isolation pair runs together (victim, then the faulter while the victim runs); every
# other program runs on its own.
PAIR_VICTIM=fault_victim
PAIR_FAULTER=fault_kernel

# Extra nvcc flags per program.
nvcc_flags_for() {
    case $1 in
        per_thread_stream) echo "--default-stream per-thread" ;;
        *) echo "" ;;
    esac
}

ALL=()
for f in "$here"/*.cu; do
    [ -e "$f" ] || continue
    n=$(basename "$f" .cu)
    ALL+=("$n")
done
[ ${#ALL[@]} -gt 0 ] || die "no .cu files in $here"

selected() { # is program $1 selected by --only?
    [ ${#ONLY[@]} -eq 0 ] && return 0
    local o
    for o in "${ONLY[@]}"; do
        [ "$o" = "$1" ] && return 0
        if [ "$1" = "$PAIR_VICTIM" ] || [ "$1" = "$PAIR_FAULTER" ]; then
            case $o in fault_isolation | "$PAIR_VICTIM" | "$PAIR_FAULTER") return 0 ;; esac
        fi
    done
    return 1
}
for o in "${ONLY[@]}"; do
    ok=0
    for n in "${ALL[@]}" fault_isolation; do [ "$o" = "$n" ] && ok=1; done
    [ $ok = 1 ] || die "--only: no program named '$o' (have: ${ALL[*]} fault_isolation)"
done

PROGS=()     # programs run alone
RUN_PAIR=0
for n in "${ALL[@]}"; do
    selected "$n" || continue
    if [ "$n" = "$PAIR_VICTIM" ] || [ "$n" = "$PAIR_FAULTER" ]; then
        RUN_PAIR=1
    else
        PROGS+=("$n")
    fi
done
if [ $RUN_PAIR = 1 ]; then
    if [ ! -f "$here/$PAIR_VICTIM.cu" ] || [ ! -f "$here/$PAIR_FAULTER.cu" ]; then die "fault pair incomplete"; fi
fi

if [ -z "$NVCC" ]; then
    if command -v nvcc >/dev/null 2>&1; then
        NVCC=nvcc
    elif [ -x /usr/local/cuda/bin/nvcc ]; then
        NVCC=/usr/local/cuda/bin/nvcc
    else
        die "nvcc not found (use --nvcc)"
    fi
fi

# ---- state and cleanup -------------------------------------------------------------------------
mkdir -p "$OUT" "$BUILD" || die "cannot create $OUT or $BUILD"
TABLE=$OUT/table.md
LOG=$OUT/log.txt
SERVER_LOG=$OUT/server.log
BUILD_LOG=$OUT/build.log
rm -f "$TABLE" "$LOG" "$SERVER_LOG" "$BUILD_LOG"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/flyt-gpu-tests.XXXXXX") || die "mktemp failed"

SERVER_PID=
BG_PIDS=()      # background subshells (the victim runs)
BG_PIDFILES=()  # pid files of the programs those run

cleanup() {
    local p f
    for f in "${BG_PIDFILES[@]}"; do
        if [ -s "$f" ]; then
            p=$(cat "$f")
            kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
        fi
    done
    for p in "${BG_PIDS[@]}"; do
        kill -0 "$p" 2>/dev/null && kill -TERM "$p" 2>/dev/null
    done
    if [ -n "$SERVER_PID" ]; then
        stop_server
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM HUP

# The server runs in a process group of its own (setsid), so its workers can be stopped with it.
stop_server() {
    local i
    [ -n "$SERVER_PID" ] || return 0
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null
    for i in $(seq 1 50); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$SERVER_PID" 2>/dev/null
    kill -KILL "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
    SERVER_PID=
}

log() { printf '%s\n' "$*" >>"$LOG"; }

# Appends a file to the log, at most its last 300 lines.
log_file() {
    local title=$1 file=$2 lines
    lines=$(wc -l <"$file" 2>/dev/null || echo 0)
    if [ "$lines" -gt 300 ]; then
        log "--- $title (last 300 of $lines lines) ---"
        tail -n 300 "$file" >>"$LOG"
    else
        log "--- $title ---"
        cat "$file" >>"$LOG" 2>/dev/null
    fi
    # A file without a final newline must not glue onto the next header.
    if [ -s "$file" ] && [ "$(tail -c 1 "$file" | od -An -c | tr -d ' ')" != '\n' ]; then
        log ""
    fi
}

{
    echo "gpu-tests run, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), mode $MODE, arch $ARCH, transports $TRANSPORTS"
    echo "nvcc: $(command -v "$NVCC") ($("$NVCC" --version 2>/dev/null | grep -i release | head -n 1))"
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
    fi
    [ "$MODE" = flyt ] && echo "dist: $DIST"
} >>"$LOG"

# ---- build -------------------------------------------------------------------------------------
TO_BUILD=("${PROGS[@]}")
[ $RUN_PAIR = 1 ] && TO_BUILD+=("$PAIR_VICTIM" "$PAIR_FAULTER")
declare -A BUILT=()
build_pids=()
for n in "${TO_BUILD[@]}"; do
    rm -f "$BUILD/$n"
    # shellcheck disable=SC2046,SC2086  # flags are deliberately word-split
    (
        set -x
        "$NVCC" -cudart=shared -arch="$ARCH" $(nvcc_flags_for "$n") ${NVCC_FLAGS:-} -o "$BUILD/$n" "$here/$n.cu"
    ) >"$TMP/$n.build" 2>&1 &
    build_pids+=($!)
done
BUILD_FAILED=()
i=0
for n in "${TO_BUILD[@]}"; do
    if wait "${build_pids[$i]}" && [ -x "$BUILD/$n" ]; then
        BUILT[$n]=1
        echo "=== $n: built" >>"$BUILD_LOG"
    else
        BUILD_FAILED+=("$n")
        echo "=== $n: BUILD FAILED" >>"$BUILD_LOG"
    fi
    cat "$TMP/$n.build" >>"$BUILD_LOG"
    i=$((i + 1))
done
echo "built ${#BUILT[@]} of ${#TO_BUILD[@]} programs into $BUILD${BUILD_FAILED[*]:+; failed: ${BUILD_FAILED[*]}}"
if [ "$MODE" = build ]; then
    [ ${#BUILD_FAILED[@]} -eq 0 ] && exit 0
    cat "$BUILD_LOG" >&2
    exit 1
fi

# ---- server ------------------------------------------------------------------------------------
TCP_ADDR=
UNIX_ADDR=
start_server() {
    local args=() t line addrs a deadline unix_listen=
    for t in "${TRANSPORT_LIST[@]}"; do
        case $t in
            tcp) args+=(--listen 127.0.0.1:0) ;;
            unix | shm) [ -n "$unix_listen" ] || { args+=(--listen "unix:$TMP/flyt.sock"); unix_listen=1; } ;;
        esac
    done
    log "=== server: $DIST/bin/flyt-rpc-server --device $DEVICE ${args[*]}"
    if command -v setsid >/dev/null 2>&1; then
        setsid "$DIST/bin/flyt-rpc-server" --device "$DEVICE" "${args[@]}" >"$TMP/server.stdout" 2>"$SERVER_LOG" </dev/null &
    else
        "$DIST/bin/flyt-rpc-server" --device "$DEVICE" "${args[@]}" >"$TMP/server.stdout" 2>"$SERVER_LOG" </dev/null &
    fi
    SERVER_PID=$!
    deadline=$((SECONDS + 60))
    while :; do
        line=$(grep -m 1 '^flyt-rpc-server listening on ' "$TMP/server.stdout" 2>/dev/null) && break
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            log "server exited before it was ready; stdout:"
            log_file "server stdout" "$TMP/server.stdout"
            SERVER_PID=
            return 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            log "server not ready within 60 s"
            return 1
        fi
        sleep 0.1
    done
    log "server ready (pid $SERVER_PID): $line"
    read -r -a addrs <<<"${line#flyt-rpc-server listening on }"
    for a in "${addrs[@]}"; do
        case $a in
            unix:*) UNIX_ADDR=$a ;;
            *) TCP_ADDR=$a ;;
        esac
    done
    for t in "${TRANSPORT_LIST[@]}"; do
        case $t in
            tcp) [ -n "$TCP_ADDR" ] || { log "server printed no TCP address"; return 1; } ;;
            unix | shm) [ -n "$UNIX_ADDR" ] || { log "server printed no unix: address"; return 1; } ;;
        esac
    done
    return 0
}

DOWN_NOTE="server not running (it died during an earlier run)"
server_alive() { [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; }

# Did the server log a session for this client pid? (ANSI colours stripped.) TRIES > 1 waits up to
# TRIES * 0.2 s for the line to appear.
session_opened() {
    local pid=$1 tries=${2:-1} i
    [ -n "$pid" ] || return 1
    for ((i = 1; i <= tries; i++)); do
        if sed 's/\x1b\[[0-9;]*m//g' "$SERVER_LOG" 2>/dev/null |
            grep -Eq "session [^ ]+ opened: .*pid=${pid}([^0-9]|\$)"; then
            return 0
        fi
        [ "$i" -lt "$tries" ] && sleep 0.2
    done
    return 1
}

# ---- running -----------------------------------------------------------------------------------
# run_prog EXE BASE TIMEOUT [VAR=value | -u VAR]...: runs EXE under `env` with those settings and a
# time limit; writes BASE.out, BASE.err, BASE.rc and BASE.pid (the program's own pid, for the session
# check: the wrapper shell writes its pid, then execs env, which execs the program).
run_prog() {
    local exe=$1 base=$2 limit=$3 rc
    shift 3
    : >"$base.pid"
    # shellcheck disable=SC2016  # $$ and $@ belong to the inner shell
    timeout -k 10 "$limit" bash -c 'echo $$ >"$0"; exec "$@"' "$base.pid" env "$@" "$exe" \
        >"$base.out" 2>"$base.err" </dev/null
    rc=$?
    echo "$rc" >"$base.rc"
    return 0
}

NATIVE_ENV=(-u FLYT_SERVER)
flyt_env() { # transport -> env settings for a Flyt run
    local addr shm=off
    case $1 in
        tcp) addr=$TCP_ADDR ;;
        unix) addr=$UNIX_ADDR ;;
        shm) addr=$UNIX_ADDR shm=on ;;
    esac
    printf '%s\n' "LD_LIBRARY_PATH=$DIST/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "FLYT_SERVER=$addr" "FLYT_SHM=$shm"
}

ROWS=()
N_PASS=0
N_FAIL=0
add_row() { # program transport same native_rc flyt_rc result note
    ROWS+=("| $1 | $2 | $3 | $4 | $5 | $6 | $7 |")
    if [ "$6" = PASS ]; then N_PASS=$((N_PASS + 1)); else N_FAIL=$((N_FAIL + 1)); fi
}

describe_rc() {
    case $1 in
        124 | 137) echo "$1 (timeout)" ;;
        *) echo "$1" ;;
    esac
}

log_run() { # title base
    log ""
    log "===== $1 | exit $(cat "$2.rc") ====="
    log_file "stdout" "$2.out"
    log_file "stderr" "$2.err"
}

# compare PROGRAM TRANSPORT NATIVE_BASE OTHER_BASE MUST_HAVE_SESSION(1|0) [EXTRA_NOTE]
compare() {
    local prog=$1 tr=$2 nb=$3 fb=$4 need_session=$5 extra=${6:-} same nrc frc result=PASS notes=()
    nrc=$(cat "$nb.rc")
    frc=$(cat "$fb.rc")
    if cmp -s "$nb.out" "$fb.out"; then same=yes; else same=no; fi
    if [ "$same" = no ]; then
        result=FAIL
        notes+=("stdout differs")
        log "--- diff native vs $tr ($prog) ---"
        diff -u --label native "$nb.out" --label "$tr" "$fb.out" >>"$LOG" 2>&1
    fi
    if [ "$nrc" != "$frc" ]; then result=FAIL; notes+=("exit status differs"); fi
    if [ "$nrc" != 0 ]; then result=FAIL; notes+=("native run failed"); fi
    case $frc in 124 | 137) notes+=("$tr run timed out") ;; esac
    if [ "$need_session" = 1 ]; then
        if ! session_opened "$(cat "$fb.pid")" 10; then
            result=FAIL
            notes+=("no session in the server log for pid $(cat "$fb.pid"): did it use the system libcudart?")
        fi
        if ! server_alive; then
            result=FAIL
            notes+=("server not running after this run")
        fi
    fi
    [ -n "$extra" ] && { result=FAIL; notes+=("$extra"); }
    local note="" x
    for x in "${notes[@]}"; do note+="${note:+; }$x"; done
    add_row "$prog" "$tr" "$same" "$(describe_rc "$nrc")" "$(describe_rc "$frc")" "$result" "$note"
}

# A native run must not have gone through Flyt (e.g. LD_LIBRARY_PATH already pointing at dist/lib).
native_used_flyt() { [ -n "$SERVER_PID" ] && session_opened "$(cat "$1.pid")"; }

# run_pair LABEL BASE_PREFIX [env settings]...: the fault-isolation pair, concurrently.
# Writes BASE_PREFIX.victim.* and BASE_PREFIX.faulter.*; sets PAIR_NOTE when the choreography failed.
PAIR_NOTE=
run_pair() {
    local label=$1 base=$2 sync i vsub
    shift 2
    PAIR_NOTE=""
    sync=$TMP/sync.$label
    rm -rf "$sync"
    mkdir -p "$sync"
    run_prog "$BUILD/$PAIR_VICTIM" "$base.victim" $((TIMEOUT + 60)) "$@" "FLYT_TEST_SYNC_DIR=$sync" &
    vsub=$!
    BG_PIDS+=("$vsub")
    BG_PIDFILES+=("$base.victim.pid")
    for i in $(seq 1 600); do
        [ -e "$sync/victim.ready" ] && break
        kill -0 "$vsub" 2>/dev/null || break
        sleep 0.1
    done
    if [ ! -e "$sync/victim.ready" ]; then
        PAIR_NOTE="victim never became ready"
    fi
    run_prog "$BUILD/$PAIR_FAULTER" "$base.faulter" "$TIMEOUT" "$@"
    : >"$sync/faulter.done"
    wait "$vsub"
    [ -s "$base.victim.rc" ] || echo 125 >"$base.victim.rc"
}

# ---- main --------------------------------------------------------------------------------------
if [ "$MODE" = flyt ]; then
    if ! start_server; then
        echo "run.sh: flyt-rpc-server did not start; see $LOG and $SERVER_LOG" >&2
        DOWN_NOTE="server did not start (see log.txt, server.log)"
    fi
    # Record which libcudart each mode resolves to, once.
    first=${PROGS[0]:-$PAIR_VICTIM}
    if [ -n "${BUILT[$first]:-}" ]; then
        log "native libcudart: $(ldd "$BUILD/$first" 2>&1 | grep libcudart)"
        log "flyt libcudart:   $(env LD_LIBRARY_PATH="$DIST/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$BUILD/$first" 2>&1 | grep libcudart)"
    fi
fi

for n in "${BUILD_FAILED[@]}"; do add_row "$n" build - - - FAIL "build failed (see build.log)"; done

for n in "${PROGS[@]}"; do
    [ -n "${BUILT[$n]:-}" ] || continue
    echo "running $n"
    nb=$TMP/$n.native
    run_prog "$BUILD/$n" "$nb" "$TIMEOUT" "${NATIVE_ENV[@]}"
    log_run "$n | native" "$nb"
    if [ "$MODE" = native ]; then
        rb=$TMP/$n.rerun
        run_prog "$BUILD/$n" "$rb" "$TIMEOUT" "${NATIVE_ENV[@]}"
        log_run "$n | native rerun" "$rb"
        compare "$n" native-rerun "$nb" "$rb" 0
        continue
    fi
    extra=""
    native_used_flyt "$nb" && extra="the native run opened a Flyt session"
    for t in "${TRANSPORT_LIST[@]}"; do
        if ! server_alive; then
            add_row "$n" "$t" - "$(cat "$nb.rc")" - FAIL "$DOWN_NOTE"
            continue
        fi
        fb=$TMP/$n.$t
        mapfile -t fenv < <(flyt_env "$t")
        run_prog "$BUILD/$n" "$fb" "$TIMEOUT" "${fenv[@]}"
        log_run "$n | $t" "$fb"
        compare "$n" "$t" "$nb" "$fb" 1 "$extra"
    done
done

if [ $RUN_PAIR = 1 ] && [ -n "${BUILT[$PAIR_VICTIM]:-}" ] && [ -n "${BUILT[$PAIR_FAULTER]:-}" ]; then
    echo "running the fault-isolation pair ($PAIR_VICTIM + $PAIR_FAULTER)"
    nb=$TMP/pair.native
    run_pair native "$nb" "${NATIVE_ENV[@]}"
    nnote=$PAIR_NOTE
    log_run "$PAIR_VICTIM | native (with $PAIR_FAULTER faulting meanwhile)" "$nb.victim"
    log_run "$PAIR_FAULTER | native (while $PAIR_VICTIM ran)" "$nb.faulter"
    [ -n "$nnote" ] && log "native pair: $nnote"
    if [ "$MODE" = flyt ] && { native_used_flyt "$nb.victim" || native_used_flyt "$nb.faulter"; }; then
        nnote="${nnote:+$nnote; }the native run opened a Flyt session"
    fi
    if [ "$MODE" = native ]; then
        rb=$TMP/pair.rerun
        run_pair rerun "$rb" "${NATIVE_ENV[@]}"
        rnote=$PAIR_NOTE
        log_run "$PAIR_VICTIM | native rerun" "$rb.victim"
        log_run "$PAIR_FAULTER | native rerun" "$rb.faulter"
        compare "$PAIR_VICTIM" native-rerun "$nb.victim" "$rb.victim" 0 "${nnote:-$rnote}"
        compare "$PAIR_FAULTER" native-rerun "$nb.faulter" "$rb.faulter" 0 "${nnote:-$rnote}"
    else
        for t in "${TRANSPORT_LIST[@]}"; do
            if ! server_alive; then
                add_row "$PAIR_VICTIM" "$t" - "$(cat "$nb.victim.rc")" - FAIL "$DOWN_NOTE"
                add_row "$PAIR_FAULTER" "$t" - "$(cat "$nb.faulter.rc")" - FAIL "$DOWN_NOTE"
                continue
            fi
            fb=$TMP/pair.$t
            mapfile -t fenv < <(flyt_env "$t")
            run_pair "$t" "$fb" "${fenv[@]}"
            fnote=$PAIR_NOTE
            log_run "$PAIR_VICTIM | $t (with $PAIR_FAULTER faulting meanwhile, same server)" "$fb.victim"
            log_run "$PAIR_FAULTER | $t (while $PAIR_VICTIM ran)" "$fb.faulter"
            compare "$PAIR_VICTIM" "$t" "$nb.victim" "$fb.victim" 1 "${nnote:-$fnote}"
            compare "$PAIR_FAULTER" "$t" "$nb.faulter" "$fb.faulter" 1 "${nnote:-$fnote}"
        done
    fi
fi

if [ "$MODE" = flyt ]; then
    if [ -n "$SERVER_PID" ] && ! server_alive; then
        log "the server was not running at the end of the run"
    fi
    stop_server
fi

# ---- table -------------------------------------------------------------------------------------
{
    if [ "$MODE" = native ]; then
        echo "| program | run | same output | first exit | second exit | result | note |"
    else
        echo "| program | transport | same output | native exit | flyt exit | result | note |"
    fi
    echo "| --- | --- | --- | --- | --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
    echo ""
    echo "total: $((N_PASS + N_FAIL)) rows, $N_PASS passed, $N_FAIL failed"
} >"$TABLE"
cat "$TABLE"
kept=""
for f in table.md log.txt server.log build.log; do [ -e "$OUT/$f" ] && kept+="${kept:+, }$f"; done
echo "results: $OUT ($kept)"
[ $N_FAIL -eq 0 ] && [ $((N_PASS + N_FAIL)) -gt 0 ]
