# shellcheck shell=bash disable=SC2153  # BUILD, BUILT and the other settings come from run.sh
# gpu-tests/soak.sh: the soak and fault rows of gpu-tests/run.sh, which sources this file after the
# program rows (it uses the runner's settings, helpers and server). Through Flyt only.
#   tenants      TENANTS apps at once per transport, a mix of the programs, each compared with native
#   kills        KILLS abrupt SIGKILLs of churn at random moments; no GPU memory may stay in use
#   worker-kill  the server's worker killed under an app blocked in a call: a CUDA error within 2 s
#   stall        an app stopped (SIGSTOP) mid-copy must not slow another session down

# cannot_run LABEL TRANSPORT: true, with LABEL's FAIL row over TRANSPORT added, when the server
# is down or the time budget is spent.
cannot_run() {
    if ! server_alive; then
        add_row "$1" "$2" - - - FAIL "$DOWN_NOTE"
        return 0
    fi
    if ! budget_left; then
        add_row "$1" "$2" - - - FAIL "not run: the time budget (--budget $BUDGET s) was spent"
        return 0
    fi
    return 1
}

soak_skip_row() { # NAME WHY
    add_row "soak: $1" "$TRANSPORTS" - - - FAIL "not run: $2"
}

soak_built() { # PROGRAM NAME: true when PROGRAM built, else row NAME is not run, saying so
    [ -n "${BUILT[$1]:-}" ] && return 0
    soak_skip_row "$2" "$1 did not build"
    return 1
}

soak_log_run() { # TITLE BASE
    {
        echo ""
        echo "===== $1 | exit $(cat "$2.rc" 2>/dev/null) ====="
    } >>"$SOAK_LOG"
    log_file "stdout" "$2.out" "$SOAK_LOG"
    log_file "stderr" "$2.err" "$SOAK_LOG"
    [ -f "$2.maps" ] && echo "maps: $(cat "$2.maps")" >>"$SOAK_LOG"
    return 0
}

join_notes() {
    local out="" x
    for x in "$@"; do out+="${out:+; }$x"; done
    printf '%s' "$out"
}

now_ns() { date +%s%N; }

# GPU memory in use (MiB), or "-" without nvidia-smi.
mem_now() {
    local m
    m=$(gpu_mem_used)
    echo "${m:--}"
}

# Waits (up to $1 * 0.5 s) until the server has no more than its warm workers and GPU memory reads
# the same twice in a row; prints "MEMORY_MIB WORKERS" (memory "-" without nvidia-smi).
settle() {
    local tries=${1:-60} i m prev=x c
    for ((i = 0; i < tries; i++)); do
        c=$(server_children)
        m=$(mem_now)
        if [ "$c" -le "$WARM_WORKERS" ] && [ "$m" = "$prev" ]; then break; fi
        prev=$m
        sleep 0.5
    done
    echo "$m $c"
}

# ---- tenants -------------------------------------------------------------------------------------
soak_tenants() {
    local entries=() e name key ref t i n=$TENANTS base pids=() ok fails notes result m count
    declare -A REF=()
    for e in "${TENANT_MIX[@]}"; do
        name=${e%% *}
        [ -n "${BUILT[$name]:-}" ] && entries+=("$e")
    done
    if [ ${#entries[@]} -eq 0 ]; then
        soak_skip_row "$n tenants at once" "none of the mix's programs built"
        return
    fi
    echo "soak: $n tenants at once per transport (${#entries[@]} programs)"
    # Native references: the program rows' native runs where they exist, else one run here.
    for e in "${entries[@]}"; do
        name=${e%% *}
        key=${e// /_}
        if [ "$e" = "$name" ] && [ -f "$TMP/$name.native.rc" ]; then
            REF[$key]=$TMP/$name.native
        else
            ref=$TMP/mixref.$key
            # shellcheck disable=SC2086  # the entry's arguments are word-split on purpose
            run_prog "$ref" "$TIMEOUT" 0 "${NATIVE_ENV[@]}" -- "$BUILD/$name" ${e#"$name"}
            soak_log_run "tenant reference: $e | native" "$ref"
            REF[$key]=$ref
        fi
    done
    for t in "${TRANSPORT_LIST[@]}"; do
        cannot_run "soak: $n tenants at once" "$t" && continue
        mapfile -t fenv < <(flyt_env "$t")
        pids=()
        local t0=$SECONDS
        for ((i = 0; i < n; i++)); do
            e=${entries[i % ${#entries[@]}]}
            name=${e%% *}
            base=$TMP/ten.$t.$i
            # shellcheck disable=SC2086
            run_prog "$base" "$TIMEOUT" "$FLYT_HIDE" "${fenv[@]}" -- "$BUILD/$name" ${e#"$name"} &
            pids+=($!)
        done
        for i in "${pids[@]}"; do wait "$i"; done
        local wall=$((SECONDS - t0))
        ok=0
        fails=()
        for ((i = 0; i < n; i++)); do
            e=${entries[i % ${#entries[@]}]}
            name=${e%% *}
            key=${e// /_}
            ref=${REF[$key]}
            base=$TMP/ten.$t.$i
            notes=()
            cmp -s "$ref.out" "$base.out" || notes+=("stdout differs")
            if in_list "$name" "${STDERR_COMPARE[@]}" && ! cmp -s <(app_stderr "$ref.err") <(app_stderr "$base.err"); then
                notes+=("stderr differs")
            fi
            [ "$(cat "$ref.rc")" = 0 ] || notes+=("native reference failed")
            [ "$(cat "$base.rc")" = "$(cat "$ref.rc")" ] || notes+=("exit $(describe_rc "$(cat "$base.rc")")")
            session_opened "$(cat "$base.pid")" 5 || notes+=("no session in the server log")
            m=$(maps_problem "$base")
            [ -n "$m" ] && notes+=("$m")
            if [ ${#notes[@]} -eq 0 ]; then
                ok=$((ok + 1))
            else
                fails+=("#$i $e: $(join_notes "${notes[@]}")")
                if [ ${#fails[@]} -le 5 ]; then
                    soak_log_run "tenant #$i ($e) | $t: $(join_notes "${notes[@]}")" "$base"
                    diff -u --label native "$ref.out" --label "$t" "$base.out" >>"$SOAK_LOG" 2>&1
                fi
            fi
        done
        result=PASS
        [ "$ok" = "$n" ] || result=FAIL
        server_alive || { result=FAIL; fails+=("server not running afterwards"); }
        count=${#fails[@]}
        local note="mix of ${#entries[@]} programs, all done in $wall s"
        [ "$count" -gt 0 ] && note+="; $count failed: $(join_notes "${fails[@]:0:4}")${fails[4]:+; ...}"
        slog "tenants $t: $ok of $n same as native, $wall s"
        add_row "soak: $n tenants at once" "$t" "$ok/$n" 0 - "$result" "$note"
        rm -f "$TMP"/ten."$t".*
    done
}

# ---- kills ---------------------------------------------------------------------------------------
KILL_DEADLINE=0
kill_slot() {
    local slot=$1 k t base rp pid ms i ready killed rc nt=${#TRANSPORT_LIST[@]}
    RANDOM=$(((BASHPID * 31 + slot * 7919) % 32768)) # each slot its own sequence
    for ((k = slot; k < KILLS; k += KILL_PAR)); do
        if [ $SECONDS -ge $KILL_DEADLINE ]; then
            echo "$k - skipped" >>"$TMP/kills.$slot"
            continue
        fi
        t=${TRANSPORT_LIST[k % nt]}
        base=$TMP/kill.$k
        mapfile -t fenv < <(flyt_env "$t")
        run_prog "$base" 120 "$FLYT_HIDE" "${fenv[@]}" CHURN_SECONDS=60 -- "$BUILD/churn" &
        rp=$!
        ready=0
        for ((i = 0; i < 3000; i++)); do # up to 30 s for its first iteration
            if [ -s "$base.out" ]; then
                ready=1
                break
            fi
            kill -0 "$rp" 2>/dev/null || break
            sleep 0.01
        done
        ms=$((RANDOM % 301))
        [ $ready = 1 ] && sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
        pid=$(cat "$base.pid" 2>/dev/null)
        killed=0
        if kill -0 "$rp" 2>/dev/null && [ -n "$pid" ]; then
            kill -KILL "$pid" 2>/dev/null && killed=1
        fi
        wait "$rp"
        rc=$(cat "$base.rc" 2>/dev/null)
        grep -q '^churn: ready' "$base.out" 2>/dev/null || ready=0
        echo "$k $t ready=$ready killed=$killed rc=$rc pid=$pid delay_ms=$ms" >>"$TMP/kills.$slot"
        if [ $ready = 1 ] && [ $killed = 1 ]; then
            rm -f "$base".*
        fi
    done
}

# Kills the server's idle workers and waits until the N it starts in their place hold their
# contexts (nvidia-smi lists them).
replace_warm_workers() {
    local n=$1 i smi=0
    [ "$n" -gt 0 ] || return 0
    command -v nvidia-smi >/dev/null 2>&1 && smi=1
    pkill -KILL -P "$SERVER_PID" 2>/dev/null
    for ((i = 0; i < 600; i++)); do
        [ "$(server_children)" -ge "$n" ] && { [ $smi = 0 ] || [ "$(gpu_apps | wc -w)" -ge "$n" ]; } && break
        sleep 0.1
    done
}

soak_kills() {
    local s pids=() m0 c0 m1 c1 m2 c2 a0 a1 i total done_ skipped notready selfexit bad opened closed reclaimed
    local result=PASS notes=() label
    soak_built churn "$KILLS kills" || return 0
    label="soak: $KILLS kills at random moments"
    if ! server_alive; then
        add_row "$label" "$TRANSPORTS" - - - FAIL "$DOWN_NOTE"
        return
    fi
    echo "soak: $KILLS abrupt kills of churn, $KILL_PAR at a time, transports $TRANSPORTS"
    # Both readings are taken with warm workers started on a quiet GPU (see below).
    read -r m0 c0 < <(settle 60)
    replace_warm_workers "$WARM_WORKERS"
    read -r m0 c0 < <(settle 60)
    a0=$(gpu_apps)
    slog "kills: before: processes with NVIDIA device files open: $(nvidia_fd_holders)"
    slog "kills: before: GPU memory used ${m0:-?} MiB, server workers $c0; processes (pid:MiB): ${a0:-none}"
    rm -f "$TMP"/kills.*
    KILL_DEADLINE=$((SECONDS + KILL_TIME))
    [ "$KILL_DEADLINE" -gt $((START_SECONDS + BUDGET)) ] && KILL_DEADLINE=$((START_SECONDS + BUDGET))
    local t0=$SECONDS
    for ((s = 0; s < KILL_PAR && s < KILLS; s++)); do
        kill_slot "$s" &
        pids+=($!)
        BG_PIDS+=($!)
    done
    for s in "${pids[@]}"; do wait "$s"; done
    local wall=$((SECONDS - t0))
    cat "$TMP"/kills.* 2>/dev/null | sort -n >"$TMP/kills.all"
    total=$(wc -l <"$TMP/kills.all")
    skipped=$(grep -c ' - skipped$' "$TMP/kills.all")
    done_=$(grep -c ' killed=1 ' "$TMP/kills.all")
    notready=$(grep -c ' ready=0 ' "$TMP/kills.all")
    selfexit=$(grep ' killed=0 ' "$TMP/kills.all" | grep -vc ' - skipped$')
    bad=$(grep ' killed=0 ' "$TMP/kills.all" | grep -v ' - skipped$' | grep -vc ' rc=0 ')
    cat "$TMP/kills.all" >>"$SOAK_LOG"
    # Apps that were not killed as planned: their output.
    while read -r k _; do
        [ -f "$TMP/kill.$k.rc" ] && soak_log_run "churn #$k (not killed as planned)" "$TMP/kill.$k"
    done < <(grep -v ' - skipped$' "$TMP/kills.all" | grep -v ' ready=1 killed=1 ' | head -n 10)
    # Afterwards: the sessions must all have closed and the memory must come back.
    for ((i = 0; i < 60; i++)); do
        c1=$(server_children)
        m1=$(mem_now)
        opened=$(server_log_plain | grep -cE 'session [0-9]+ opened: program=churn ')
        closed=$(server_log_plain | grep -E 'session [0-9]+ closed' | grep -c 'program=churn')
        if [ "$c1" = "$c0" ] && [ "$m1" = "$m0" ] && [ "$opened" = "$closed" ]; then break; fi
        sleep 0.5
    done
    reclaimed=$(server_log_plain | grep -E 'session [0-9]+ closed' | grep 'program=churn' |
        sed -n 's/.*leaked_bytes_reclaimed=\([0-9][0-9]*\).*/\1/p' | awk '{s += $1} END {print s + 0}')
    a1=$(gpu_apps)
    slog "kills: after: processes with NVIDIA device files open: $(nvidia_fd_holders)"
    slog "kills: after: GPU memory used ${m1:-?} MiB, server workers $c1, churn sessions opened $opened closed $closed, reclaimed $reclaimed bytes; processes (pid:MiB): ${a1:-none}"
    notes+=("$done_ killed (of $total; ${wall} s)")
    [ "$done_" -lt "$KILLS" ] && { result=FAIL; notes+=("only $done_ of $KILLS kills done (${skipped} not started: --kill-time $KILL_TIME s or --budget $BUDGET s reached)"); }
    [ "$notready" -gt 0 ] && { result=FAIL; notes+=("$notready apps never printed 'churn: ready'"); }
    [ "$bad" -gt 0 ] && { result=FAIL; notes+=("$bad apps exited by themselves with an error (soak.log)"); }
    [ "$selfexit" -gt 0 ] && [ "$bad" = 0 ] && notes+=("$selfexit apps ended before their kill")
    # The warm workers started during the soak hold contexts made among a thousand others coming
    # and going: the driver's own share of them (not booked to any process by nvidia-smi) can be a
    # few MiB larger than that of workers started on a quiet GPU (seen: 2-12 MiB, after the kills
    # and after the tenants soak). Whether anything leaked is read after they are replaced by
    # fresh ones, as they were before the soak.
    replace_warm_workers "$WARM_WORKERS"
    read -r m2 c2 < <(settle 60)
    slog "kills: after replacing the warm workers: GPU memory used ${m2:-?} MiB, server workers $c2; processes (pid:MiB): $(gpu_apps)"
    if [ "$m0" = - ] || [ "$m2" = - ]; then
        result=FAIL
        notes+=("GPU memory not measured (no nvidia-smi)")
    else
        # Fresh sets of 16 workers read a few MiB apart from run to run; more used after than
        # before is a leak, less is not.
        notes+=("GPU memory used $m0 MiB before, $m2 MiB after ($((m2 > m0 ? m2 - m0 : 0)) MiB leaked), with the warm workers replaced as the server replaces dead ones ($m1 MiB with those started during the soak)")
        if [ "$m2" -gt "$m0" ]; then
            result=FAIL
            notes+=("processes before: ${a0:-none}; after: $(gpu_apps)")
        fi
    fi
    notes+=("server workers $c0 before, $c2 after")
    [ "$c2" = "$c0" ] || result=FAIL
    notes+=("churn sessions: $opened opened, $closed closed; the server reclaimed $reclaimed bytes from them")
    [ "$opened" = "$closed" ] || result=FAIL
    server_alive || { result=FAIL; notes+=("server not running afterwards"); }
    add_row "$label" "$TRANSPORTS" - - - "$result" "$(join_notes "${notes[@]}")"
    rm -f "$TMP"/kill.*
}

# ---- worker killed mid-call ----------------------------------------------------------------------
soak_worker_kill() {
    local t mode base sync i app w tk te lat rc notes result err
    soak_built hold_call "worker killed mid-call" || return 0
    for t in "${TRANSPORT_LIST[@]}"; do
        for mode in kernel copies; do
            local label="soak: worker killed mid-call ($mode)"
            cannot_run "$label" "$t" && continue
            echo "soak: worker killed under hold_call $mode over $t"
            base=$TMP/wk.$t.$mode
            sync=$TMP/wk.$t.$mode.sync
            rm -rf "$sync"
            mkdir -p "$sync"
            mapfile -t fenv < <(flyt_env "$t")
            run_prog "$base" 60 "$FLYT_HIDE" "${fenv[@]}" "FLYT_TEST_SYNC_DIR=$sync" -- "$BUILD/hold_call" "$mode" &
            app=$!
            notes=()
            result=PASS
            tk=
            if wait_ready "$sync/ready" "$app"; then
                sleep 0.5
                if w=$(worker_of "$(cat "$base.pid")" 50); then
                    tk=$(now_ns)
                    kill -KILL "$w" 2>/dev/null || notes+=("could not kill worker $w")
                else
                    notes+=("no worker for pid $(cat "$base.pid") in the server log")
                fi
            else
                notes+=("hold_call never became ready")
            fi
            wait "$app"
            rc=$(cat "$base.rc")
            soak_log_run "hold_call $mode | $t (worker ${w:-?} killed at ${tk:-never} ns)" "$base"
            te=$(sed -n 's/^hold_call: error at unix ns \([0-9][0-9]*\)$/\1/p' "$base.out")
            err=$(sed -n 's/^hold_call: .* failed with \([A-Za-z]*\) after.*/\1/p' "$base.out")
            [ "$rc" = 0 ] || { result=FAIL; notes+=("hold_call exited $(describe_rc "$rc")"); }
            if [ -n "$tk" ] && [ -n "$te" ]; then
                lat=$(((te - tk) / 1000000))
                notes+=("$err ${lat} ms after the kill")
                [ "$lat" -le 2000 ] || { result=FAIL; notes+=("slower than 2 s"); }
            else
                result=FAIL
                notes+=("no error time")
            fi
            grep -q '^hold_call: a later cudaMalloc: cudaSuccess' "$base.out" && { result=FAIL; notes+=("a later call succeeded"); }
            m=$(maps_problem "$base")
            [ -n "$m" ] && { result=FAIL; notes+=("$m"); }
            server_alive || { result=FAIL; notes+=("server not running afterwards"); }
            add_row "$label" "$t" - - "$(describe_rc "$rc")" "$result" "$(join_notes "${notes[@]}")"
        done
    done
}

# ---- a client that stops reading -------------------------------------------------------------------
# run_steady BASE WHEN [WHEN_NOTE]: soak_stall's steady workload (stall_pair steady over transport
# t, its environment fenv), its files BASE.*, logged as run WHEN; its time in STEADY_MS; a failure
# noted (as exited WHEN_NOTE, default WHEN) in soak_stall's result and notes.
run_steady() {
    local t0
    t0=$(now_ns)
    run_prog "$1" 120 "$FLYT_HIDE" "${fenv[@]}" -- "$BUILD/stall_pair" steady
    STEADY_MS=$((($(now_ns) - t0) / 1000000))
    soak_log_run "stall_pair steady $2 | $t (${STEADY_MS} ms)" "$1"
    [ "$(cat "$1.rc")" = 0 ] || { result=FAIL; notes+=("steady ${3:-$2} exited $(describe_rc "$(cat "$1.rc")")"); }
}

soak_stall() {
    local t base sync i r rp rpid solo stalled bound rc notes result sb
    soak_built stall_pair "stopped reader" || return 0
    for t in "${TRANSPORT_LIST[@]}"; do
        local label="soak: app stopped mid-copy, another app's time"
        cannot_run "$label" "$t" && continue
        echo "soak: a stopped reader and a steady app over $t"
        mapfile -t fenv < <(flyt_env "$t")
        notes=()
        result=PASS
        # 1. The steady workload alone.
        sb=$TMP/stall.$t.solo
        run_steady "$sb" "alone"
        solo=$STEADY_MS
        # 2. The reader, stopped in the middle of its copies.
        base=$TMP/stall.$t.reader
        sync=$TMP/stall.$t.sync
        rm -rf "$sync"
        mkdir -p "$sync"
        run_prog "$base" 240 "$FLYT_HIDE" "${fenv[@]}" "FLYT_TEST_SYNC_DIR=$sync" -- "$BUILD/stall_pair" reader &
        r=$!
        rpid=
        if wait_ready "$sync/ready" "$r"; then
            sleep 0.3
            rpid=$(cat "$base.pid")
            kill -STOP "$rpid" && STOPPED_PIDS+=("$rpid")
        else
            result=FAIL
            notes+=("the reader never became ready")
        fi
        # 3. The steady workload while the reader is stopped.
        sb=$TMP/stall.$t.stalled
        run_steady "$sb" "while the reader is stopped" "with the reader stopped"
        stalled=$STEADY_MS
        [ -n "$rpid" ] && kill -CONT "$rpid"
        : >"$sync/stop"
        wait "$r"
        soak_log_run "stall_pair reader | $t (stopped while steady ran)" "$base"
        rc=$(cat "$base.rc")
        [ "$rc" = 0 ] || { result=FAIL; notes+=("the reader exited $(describe_rc "$rc") after SIGCONT"); }
        bound=$((solo * 3 / 2))
        [ "$bound" -lt $((solo + 1000)) ] && bound=$((solo + 1000))
        notes+=("steady ${solo} ms alone, ${stalled} ms with a reader stopped mid-copy (bound ${bound} ms)")
        [ "$stalled" -le "$bound" ] || result=FAIL
        m=$(maps_problem "$sb")
        [ -n "$m" ] && { result=FAIL; notes+=("$m"); }
        server_alive || { result=FAIL; notes+=("server not running afterwards"); }
        add_row "$label" "$t" - - "$(describe_rc "$(cat "$sb.rc")")" "$result" "$(join_notes "${notes[@]}")"
    done
}

if [ -n "${SOAK_ON[tenants]:-}" ]; then
    if budget_left; then soak_tenants; else soak_skip_row "$TENANTS tenants at once" "the time budget (--budget $BUDGET s) was spent"; fi
fi
if [ -n "${SOAK_ON[worker-kill]:-}" ]; then soak_worker_kill; fi
if [ -n "${SOAK_ON[stall]:-}" ]; then soak_stall; fi
if [ -n "${SOAK_ON[kills]:-}" ]; then
    if budget_left; then soak_kills; else soak_skip_row "$KILLS kills at random moments" "the time budget (--budget $BUDGET s) was spent"; fi
fi
