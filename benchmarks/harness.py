#!/usr/bin/env python3
"""Flyt benchmark harness: runs the benchmark programs natively and through Flyt over each transport,
collects their JSON lines, and writes results.md, results.json, PNG plots, flyt_stats.txt and log.txt.

  harness.py run    --build DIR --out DIR [--transports native,unix,tcp,shm] [--quick] ...   (run.sh calls this)
  harness.py report --from results.json --out DIR        re-render the report from a saved results.json
  harness.py report --lines-dir DIR --out DIR            render from JSON-lines files: DIR/<transport>/<program>.jsonl
                                                         and DIR/raw_stream.jsonl (used to test the report code)

Only the Python standard library and matplotlib (for the plots; skipped with a note if missing) are used.
"""

import argparse
import datetime
import json
import os
import platform
import re
import select
import signal
import statistics
import subprocess
import sys
import time

TRANSPORTS = ["native", "unix", "tcp", "shm"]
FLYT = ["unix", "tcp", "shm"]
SOCKETS = ["unix", "tcp"]
COLORS = {"native": "black", "unix": "tab:blue", "tcp": "tab:orange", "shm": "tab:green"}

# program -> (timeout default, timeout quick). The harness also keeps a global time budget.
PROGRAMS = {
    "probe": (30, 20),
    "micro": (60, 30),
    "copy": (120, 45),
    "matmul": (60, 30),
    # The same programs built with nvcc's default static runtime: NVIDIA's runtime over Flyt's libcuda.so.1.
    "micro_static": (60, 30),
    "copy_static": (120, 45),
    "matmul_static": (60, 30),
    # cuBLAS (its own runtime, over Flyt's libcuda.so.1) and the time to a first kernel, static runtime.
    "cublas": (90, 45),
    "first_kernel": (30, 20),
    # PyTorch (its bundled runtime over Flyt's libcuda.so.1), with --python.
    "torch": (240, 150),
    "launch_heavy": (60, 25),
    # A 1000-node graph (stream capture of 1000 small kernels), instantiated once, launched 1000 times.
    "graph": (60, 30),
    # CUDA IPC: a second process opens the first one's exported allocation, then reopens it.
    "ipc": (60, 30),
    "pipeline": (150, 40),
    "idle_cpu": (150, 90),
}
ORDER = ["micro", "copy", "matmul", "micro_static", "copy_static", "matmul_static", "cublas", "first_kernel", "torch",
         "launch_heavy", "graph", "ipc", "idle_cpu", "pipeline"]
# Programs run as several processes in a row (records tagged with the run): start-up is measured
# per process, and PyTorch's second run shows what a warm image cache saves.
REPEATS = {"first_kernel": (7, 5)}
# Seconds between those runs: each app meets a warm worker, as the row says. Apps back to back
# outrun the pool (a worker takes 150-600 ms to open its device on an H200) and alternate between
# ~2 ms and a 300-500 ms wait, so a median of them measured the pool's timing, not the path
# (benchmarks/diagnostics/first_call.sh shows both, 2026-11-29).
PAUSE_BETWEEN_RUNS = {"first_kernel": 1.0}
# Programs run in rounds, each round over every transport in turn (native, unix, tcp, shm, then
# again), so a drift of the machine over the minute a program takes on all transports lands on
# every column alike; each figure of theirs is the median over the rounds (default, quick).
ROUNDS = {"micro": (5, 2), "torch": (2, 2)}
# Programs whose rounds stand for runs (a round's records carry run = round): PyTorch's rows take the
# better of its runs and its second run meets a warm image cache, yet a slow half-minute of the
# machine must not land on one transport's two runs.
ROUNDS_ARE_RUNS = {"torch"}
# What FLYT_STATS=1 prints about module images at exit.
IMAGES_LINE = re.compile(r"module images: (\d+) sent \((\d+) bytes\)")
IDLE_SESSIONS = (64, 16)  # apps in the "64 idle sessions" measurement: default, quick
LOG_TAIL_CHARS = 20000
MiB = 1 << 20


# ----------------------------------------------------------------------------------------------------------
# running


class Runner:
    def __init__(self, a):
        self.a = a
        self.t0 = time.monotonic()
        self.deadline = self.t0 + a.budget_s
        self.log = []  # text blocks for log.txt
        self.runs = {t: {} for t in TRANSPORTS}
        self.status = {}  # transport -> "ok" | "n/a: reason" | "not requested"
        self.stats_runs = {}
        self.raw = []
        self.rtt = []
        self.current = None  # the benchmark process running now
        signal.signal(signal.SIGTERM, self.on_signal)

    def on_signal(self, signum, _frame):
        if self.current and self.current.poll() is None:
            self.current.kill()
        print(f"harness: stopped by signal {signum}; writing what was measured", file=sys.stderr, flush=True)
        try:
            self.note(f"harness: interrupted by signal {signum}")
            res = self.results()
            res["meta"]["interrupted"] = True
            write_report(res, self.a.out, self.log, stats_file_text(self))
        finally:
            os._exit(128 + signum)

    def remaining(self):
        return self.deadline - time.monotonic()

    def env_for(self, transport, extra=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLYT_")}
        # Prepend, never replace: the machine's own LD_LIBRARY_PATH may be how libcuda.so.1 is found.
        inherited = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
        if transport == "native":
            first = [p for p in self.a.cuda_lib.split(":") if p]
        else:
            first = [os.path.join(os.path.abspath(self.a.dist), "lib")]
        env["LD_LIBRARY_PATH"] = ":".join(first + [p for p in inherited if p not in first])
        if transport != "native":
            if transport == "tcp":
                env["FLYT_SERVER"] = self.a.tcp_addr
                # run.sh --tls: the server requires TLS on TCP.
                if os.environ.get("FLYT_TLS_CA"):
                    env["FLYT_TLS_CA"] = os.environ["FLYT_TLS_CA"]
            else:
                env["FLYT_SERVER"] = self.a.unix_addr
            # Same-host detection is automatic in Flyt: the socket transports must turn the channel off.
            env["FLYT_SHM"] = "on" if transport == "shm" else "off"
        if transport != "native":
            env.update(self.a.app_env)
        if extra:
            env.update(extra)
        return env

    def server_alive(self):
        if not self.a.server_pid:
            return True
        try:
            os.kill(self.a.server_pid, 0)
            return True
        except OSError:
            return False

    def execute(self, label, cmd, env, timeout):
        """Runs one command; returns a dict with rc, wall_s, timed_out, records, stderr."""
        timeout = min(timeout, self.remaining())
        if timeout < 3:
            self.note(f"[{label}] skipped: the time budget ({self.a.budget_s:.0f} s) is spent")
            return {"rc": None, "skipped": "time budget", "records": [], "stderr": "", "wall_s": 0.0}
        flyt_env = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith("FLYT_") or k == "LD_LIBRARY_PATH")
        t = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                             errors="replace")
        self.current = p
        timed_out = False
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            p.kill()
            out, err = p.communicate()
        self.current = None
        wall = time.monotonic() - t
        records, junk = [], 0
        for line in out.splitlines():
            line = line.strip()
            if not line.startswith("{"):
                junk += 1
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                junk += 1
        rc = p.returncode
        state = "TIMEOUT" if timed_out else f"rc={rc}"
        self.log.append(f"=== [{label}] {' '.join(cmd)}\n    env: {flyt_env}\n    {state}, {wall:.1f} s, "
                        f"{len(records)} result lines, {junk} other stdout lines\n" + tail(err, LOG_TAIL_CHARS))
        print(f"  [{label}] {state} in {wall:.1f} s, {len(records)} results", file=sys.stderr, flush=True)
        return {"rc": rc, "timed_out": timed_out, "wall_s": round(wall, 3), "cmd": cmd, "records": records,
                "stderr": err}

    def note(self, text):
        print(text, file=sys.stderr, flush=True)
        self.log.append(text + "\n")

    def program_cmd(self, prog, transport, quick):
        if prog == "torch":
            cmd = [self.a.python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_bench.py")]
            return cmd + (["--quick"] if quick else [])
        cmd = [os.path.join(self.a.build, prog)]
        if quick:
            cmd.append("--quick")
        if prog in ("matmul", "matmul_static") and transport != "native":
            reps = native_matmul_reps(self.runs)
            if reps:
                cmd += ["--reps", str(reps)]
        return cmd

    def run_program(self, prog, transport, round_=0):
        if not self.a.dist_ok and transport != "native":
            return
        if transport != "native" and not self.server_alive():
            self.note(f"[{transport}/{prog}] skipped: flyt-rpc-server is no longer running")
            self.runs[transport][prog] = {"rc": None, "skipped": "server not running", "records": [], "stderr": ""}
            return
        if prog == "torch" and not self.a.python:
            self.runs[transport][prog] = {"rc": None, "skipped": "no --python", "records": [], "stderr_tail": ""}
            return
        timeout = PROGRAMS[prog][1 if self.a.quick else 0]
        repeats = REPEATS.get(prog, (1, 1))[1 if self.a.quick else 0]
        # PyTorch over Flyt reports what its module images cost (FLYT_STATS=1, at exit).
        extra = {"FLYT_STATS": "1"} if prog == "torch" and transport != "native" else None
        res = None
        for run in range(repeats):
            if run > 0 and transport != "native":
                time.sleep(PAUSE_BETWEEN_RUNS.get(prog, 0))
            one = self.execute(f"{transport}/{prog}", self.program_cmd(prog, transport, self.a.quick),
                               self.env_for(transport, extra), timeout)
            run_index = round_ if prog in ROUNDS_ARE_RUNS else run
            for record in one["records"]:
                record["run"] = run_index
                record["round"] = round_
            images = IMAGES_LINE.search(one["stderr"])
            if images:
                one["records"].append({"bench": "images", "run": run_index, "sent": int(images[1]),
                                       "bytes": int(images[2])})
            if res is None:
                res = one
            else:
                res["records"] += one["records"]
                res["stderr"] += one["stderr"]
                if one.get("rc") != 0 or one.get("timed_out"):
                    res.update(rc=one.get("rc"), timed_out=one.get("timed_out"))
                    break
        res["stderr_tail"] = tail(res.pop("stderr"), 4000)
        earlier = self.runs[transport].get(prog) if round_ > 0 else None
        if earlier:
            res["records"] = earlier["records"] + res["records"]
            res["stderr_tail"] = tail(earlier.get("stderr_tail", "") + res["stderr_tail"], 4000)
        self.runs[transport][prog] = res

    def run_all(self):
        a = self.a
        wanted = [t for t in TRANSPORTS if t in a.transports]
        for t in TRANSPORTS:
            if t not in wanted:
                self.status[t] = "not requested"
        # 1. raw socket streams: the floor for the socket transports
        if a.raw_stream and any(t in wanted for t in SOCKETS):
            sizes = "64M,256M"
            for sock in SOCKETS:
                if sock not in wanted:
                    continue
                res = self.execute(f"raw_stream/{sock}", [a.raw_stream, "pair", sock, sizes, "3" if a.quick else "5"],
                                   dict(os.environ), 30)
                self.raw += [r for r in res["records"] if r.get("bench") == "raw_stream"]
        # 1b. raw round trips (small-message ping-pong): the floor of a synchronizing call per transport
        if a.raw_rtt and any(t in wanted for t in FLYT):
            res = self.execute("raw_rtt", [a.raw_rtt, "5000" if a.quick else "20000", "64", "unix,tcp,shm"],
                               dict(os.environ), 60)
            self.rtt = [r for r in res["records"] if r.get("bench") == "raw_rtt"]
        # 2. probe: a transport whose first run fails is absent ("n/a")
        live = []
        for t in wanted:
            if t != "native" and not a.dist_ok:
                self.status[t] = f"n/a: {a.dist_problem}"
                continue
            self.run_program("probe", t)
            r = self.runs[t].get("probe", {})
            probe_ok = any(x.get("bench") == "probe" and x.get("ok") for x in r.get("records", []))
            if r.get("rc") == 0 and probe_ok:
                self.status[t] = "ok"
                live.append(t)
            else:
                why = r.get("skipped") or ("timed out" if r.get("timed_out") else f"exit status {r.get('rc')}")
                last = last_line(r.get("stderr_tail", ""))
                self.status[t] = f"n/a: probe failed ({why}{': ' + last if last else ''})"
                self.note(f"transport {t}: {self.status[t]}")
        # 3. the benchmarks, program by program, each over every live transport (native first). A transport
        #    whose runs fail twice in a row with no results (a hang, a crash) is not run any further.
        failures = {t: 0 for t in live}
        for prog in ORDER:
            if a.programs and prog not in a.programs:
                continue
            if prog == "idle_cpu":
                for t in live:
                    if failures[t] < 2:
                        self.run_idle(t)
                continue
            for round_ in range(ROUNDS.get(prog, (1, 1))[1 if a.quick else 0]):
                for t in live:
                    if failures[t] >= 2:
                        if round_ == 0:
                            self.runs[t][prog] = {"rc": None, "skipped": f"{t} failed twice in a row", "records": [],
                                                  "stderr_tail": ""}
                        continue
                    self.run_program(prog, t, round_)
                    r = self.runs[t][prog]
                    bad = r.get("timed_out") or (r.get("rc") not in (0, None) and not r.get("records"))
                    failures[t] = failures[t] + 1 if bad else 0
            # FLYT_STATS=1: the launch-heavy app once more per Flyt transport, its stderr kept
            if prog == "launch_heavy":
                for t in live:
                    if t != "native" and failures[t] < 2:
                        self.run_stats(t)

    def run_stats(self, t):
        cmd = [os.path.join(self.a.build, "launch_heavy"), "--rounds", "2", "--cap-s", "10"]
        res = self.execute(f"{t}/launch_heavy FLYT_STATS=1", cmd, self.env_for(t, {"FLYT_STATS": "1"}), 40)
        self.stats_runs[t] = {"rc": res.get("rc"), "timed_out": res.get("timed_out"), "wall_s": res.get("wall_s"),
                              "cmd": cmd, "stderr": res.get("stderr", ""), "skipped": res.get("skipped")}

    # ---- idle CPU ---------------------------------------------------------------------------------

    def server_sample(self, *pids):
        """A CPU sample of the server's listener and the given worker pids (None skipped)."""
        return cpu_sample((self.a.server_pid,) + pids)

    def run_idle(self, t):
        """The idle-CPU measurements (a)-(d) over one transport; results as the program "idle_cpu"."""
        a = self.a
        exe = os.path.join(a.build, "idle_cpu")
        env = self.env_for(t)
        recs, notes = [], []
        t_start = time.monotonic()
        flyt = t != "native"
        if flyt and not self.server_alive():
            self.runs[t]["idle_cpu"] = {"rc": None, "skipped": "server not running", "records": [], "stderr_tail": ""}
            return
        if self.remaining() < 60:
            self.note(f"[{t}/idle_cpu] skipped: the time budget ({a.budget_s:.0f} s) is spent")
            self.runs[t]["idle_cpu"] = {"rc": None, "skipped": "time budget", "records": [], "stderr_tail": ""}
            return

        def worker(app):
            return worker_for(app.pid, a.server_log, 5.0) if flyt and a.server_log else None

        def one_app(mode, measure):
            """Starts idle_cpu MODE and, once it is ready, keeps the record measure(app, its worker)
            gives; a failure is noted under MODE."""
            app = None
            try:
                app = IdleApp([exe, mode], env)
                app.wait_mark("ready", 60)
                recs.append(measure(app, worker(app)))
            except (IdleError, OSError) as e:
                notes.append(f"{mode}: {e}")
            finally:
                if app:
                    notes.append(app.finish())

        # (a) blocked on a 2 s kernel
        def blocked(app, w):
            s0 = self.server_sample(w) if flyt else {}
            app.send("go")
            rec = app.wait_record("idle_blocked", 30)
            s1 = self.server_sample(w) if flyt else {}
            if flyt:
                rec["server_cpu_pct"] = 100.0 * cpu_delta(s0, s1) / max(rec.get("wall_s") or 1e-9, 1e-9)
                rec["worker_found"] = w is not None
            return rec

        one_app("blocked", blocked)

        # (b) idle between bursts
        def bursts(app, w):
            s0, w0 = (self.server_sample(w) if flyt else {}), time.monotonic()
            app.send("go")
            rec = app.wait_record("idle_bursts", 30)
            s1, w1 = (self.server_sample(w) if flyt else {}), time.monotonic()
            if flyt:
                rec["server_cpu_pct_whole_run"] = 100.0 * cpu_delta(s0, s1) / (w1 - w0)
            return rec

        one_app("bursts", bursts)

        # (c) one idle session, server and app
        def idle(app, w):
            time.sleep(0.2)
            s0, w0 = (self.server_sample(w) if flyt else {}), time.monotonic()
            app.send("start")
            time.sleep(3.0)
            app.send("stop")
            s1, w1 = (self.server_sample(w) if flyt else {}), time.monotonic()
            rec = app.wait_record("idle_session", 30)
            if flyt:
                rec["server_cpu_pct"] = 100.0 * cpu_delta(s0, s1) / (w1 - w0)
                rec["worker_found"] = w is not None
            return rec

        one_app("idle", idle)
        # (d) many idle sessions at once
        n = IDLE_SESSIONS[1 if a.quick else 0]
        apps = []
        try:
            for _ in range(n):
                apps.append(IdleApp([exe, "idle"], env))
            deadline = time.monotonic() + 180
            for app in apps:
                app.wait_mark("ready", max(1.0, deadline - time.monotonic()))
            time.sleep(0.2)
            tree = proc_tree(a.server_pid) if flyt else []
            s0, w0 = cpu_sample(tree), time.monotonic()
            for app in apps:
                app.send("start")
            time.sleep(5.0)
            for app in apps:
                app.send("stop")
            s1, w1 = cpu_sample(tree), time.monotonic()
            got = [app.wait_record("idle_session", 60) for app in apps]
            pcts = [r.get("cpu_pct") or 0.0 for r in got]
            rec = {"bench": "idle_many", "sessions": n, "app_cpu_pct_mean": sum(pcts) / len(pcts),
                   "app_cpu_pct_max": max(pcts)}
            if flyt:
                rec["server_cpu_pct_total"] = 100.0 * cpu_delta(s0, s1) / (w1 - w0)
                rec["server_cpu_pct_per_session"] = rec["server_cpu_pct_total"] / n
                rec["server_processes"] = len(tree)
            recs.append(rec)
        except (IdleError, OSError) as e:
            notes.append(f"{n} idle sessions: {e}")
        finally:
            for app in apps:
                notes.append(app.finish())
        notes = [x for x in notes if x]
        wall = time.monotonic() - t_start
        self.log.append(f"=== [{t}/idle_cpu] {len(recs)} results in {wall:.1f} s\n" +
                        "".join(json.dumps(r) + "\n" for r in recs) + "".join(x + "\n" for x in notes))
        print(f"  [{t}/idle_cpu] {len(recs)} results in {wall:.1f} s", file=sys.stderr, flush=True)
        self.runs[t]["idle_cpu"] = {"rc": 0 if len(recs) == 4 else 1, "wall_s": round(wall, 3), "records": recs,
                                    "stderr_tail": tail("\n".join(notes), 4000)}

    def results(self):
        return {
            "meta": {
                "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "mode": "quick" if self.a.quick else "default",
                "host": platform.node(),
                "kernel": platform.release(),
                "cpus": os.cpu_count(),
                "dist": os.path.abspath(self.a.dist),
                "transports": self.status,
                "harness_s": round(time.monotonic() - self.t0, 1),
                "budget_s": self.a.budget_s,
                "tcp_addr": self.a.tcp_addr,
                "unix_addr": self.a.unix_addr,
                "app_env": [f"{name}={value}" for name, value in self.a.app_env],
            },
            "raw_stream": self.raw,
            "raw_rtt": self.rtt,
            "runs": self.runs,
            "stats_runs": {t: {k: v for k, v in r.items() if k != "stderr"} for t, r in self.stats_runs.items()},
        }


class IdleError(Exception):
    pass


class IdleApp:
    """One idle_cpu process driven over stdin/stdout: marks and result lines are JSON."""

    def __init__(self, cmd, env):
        self.cmd = cmd
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=env)
        self.pid = self.p.pid
        self.buf = b""
        self.lines = []

    def _line(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise IdleError(f"{' '.join(self.cmd[1:])}: no output within {timeout:.0f} s")
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if r:
                chunk = os.read(self.p.stdout.fileno(), 65536)
                if not chunk:
                    raise IdleError(f"{' '.join(self.cmd[1:])}: exited ({self.p.wait()}): "
                                    f"{last_line(self.p.stderr.read().decode(errors='replace'))}")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace").strip()

    def _json(self, timeout):
        while True:
            line = self._line(timeout)
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    pass

    def wait_mark(self, name, timeout):
        while True:
            j = self._json(timeout)
            if j.get("mark") == name:
                return
            if j.get("error"):
                raise IdleError(f"{j.get('bench')}: {j['error']}")

    def wait_record(self, bench, timeout):
        while True:
            j = self._json(timeout)
            if j.get("bench") == bench:
                return j
            if j.get("error"):
                raise IdleError(f"{j.get('bench')}: {j['error']}")

    def send(self, text):
        try:
            self.p.stdin.write((text + "\n").encode())
            self.p.stdin.flush()
        except OSError as e:
            raise IdleError(f"{' '.join(self.cmd[1:])}: stdin: {e}") from e

    def finish(self):
        """Ends the process (EOF on stdin, then kill if needed); returns a note when it failed."""
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            rc = self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        err = self.p.stderr.read().decode(errors="replace") if self.p.stderr else ""
        return "" if rc == 0 else f"{' '.join(self.cmd[1:])} exited {rc}: {last_line(err)}"


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_sample(pid):
    """(per-thread CPU ns from schedstat, process CPU s from /proc/PID/stat) of a live process; None if gone."""
    threads = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    threads[tid] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return threads, (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, ValueError, IndexError):
        return None


def cpu_sample(pids):
    return {p: proc_sample(p) for p in pids if p}


def cpu_delta(s0, s1):
    """CPU seconds the processes used between two samples. Per process: the threads' schedstat (ns
    resolution) when no thread of the first sample is gone, else utime + stime from stat (clock ticks,
    which keep the time of exited threads). A process gone by the second sample counts 0."""
    total = 0.0
    for pid, a in s0.items():
        b = s1.get(pid)
        if not a or not b:
            continue
        (ta, sa), (tb, sb) = a, b
        if ta and set(ta) <= set(tb):
            total += sum(ns - ta.get(tid, 0) for tid, ns in tb.items()) / 1e9
        else:
            total += sb - sa
    return total


def proc_tree(root):
    """root and all its descendants (pids), from /proc/*/stat."""
    if not root:
        return []
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return out


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def worker_for(app_pid, log_path, timeout):
    """The server's worker pid for the session of client app_pid, from the server log's "opened" line."""
    pat = re.compile(rf"session \S+ opened: .*pid={app_pid}\b.* worker=(\d+)")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(log_path, errors="replace") as f:
                for line in f:
                    m = pat.search(ANSI.sub("", line))
                    if m:
                        return int(m.group(1))
        except OSError:
            pass
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def native_matmul_reps(runs):
    for r in runs.get("native", {}).get("matmul", {}).get("records", []):
        if r.get("bench") == "matmul" and r.get("reps"):
            return int(r["reps"])
    return None


def tail(text, n):
    if not text:
        return ""
    if len(text) <= n:
        return text if text.endswith("\n") else text + "\n"
    return "[... " + str(len(text) - n) + " characters cut ...]\n" + text[-n:] + ("" if text.endswith("\n") else "\n")


def last_line(text):
    lines = [x for x in (text or "").splitlines() if x.strip()]
    return lines[-1].strip()[:200] if lines else ""


# ----------------------------------------------------------------------------------------------------------
# extracting numbers


class Data:
    def __init__(self, results):
        self.res = results
        self.runs = results.get("runs", {})
        self.status = results.get("meta", {}).get("transports", {})

    def records(self, transport, prog):
        return self.runs.get(transport, {}).get(prog, {}).get("records", [])

    def find(self, transport, prog, bench, **match):
        for r in self.records(transport, prog):
            if r.get("bench") == bench and all(r.get(k) == v for k, v in match.items()):
                return r
        return None

    def across_runs(self, transport, prog, bench, field, combine):
        """`combine` (median, min...) of `field` over a program's runs (REPEATS), or None."""
        values = [r[field] for r in self.records(transport, prog) if r.get("bench") == bench and isinstance(r.get(field), (int, float))]
        return combine(values) if values else None

    def value(self, transport, prog, bench, field, **match):
        if prog in ROUNDS and prog not in ROUNDS_ARE_RUNS:
            values = [r[field] for r in self.records(transport, prog)
                      if r.get("bench") == bench and all(r.get(k) == v for k, v in match.items())
                      and isinstance(r.get(field), (int, float))]
            return float(statistics.median(values)) if values else None
        r = self.find(transport, prog, bench, **match)
        v = r.get(field) if r else None
        return float(v) if isinstance(v, (int, float)) else None

    def raw(self, socket, direction, nbytes):
        for r in self.res.get("raw_stream", []):
            if r.get("socket") == socket and r.get("dir") == direction and r.get("bytes") == nbytes:
                return float(r["gbps"])
        return None

    def rtt(self, transport, mode=None, field="p50_us"):
        """Raw round trip of a transport: sockets blocking (or mode), shm spinning."""
        mode = mode or ("spin" if transport == "shm" else "blocking")
        for r in self.res.get("raw_rtt", []):
            if r.get("transport") == transport and r.get("mode") == mode and r.get(field) is not None:
                return float(r[field])
        return None

    def meta(self):
        for t in TRANSPORTS:
            for prog in ["probe", "micro"]:
                r = self.find(t, prog, "meta")
                if r and r.get("gpu"):
                    return r
        return {}

    def transports(self):
        """Transports with any result."""
        return [t for t in TRANSPORTS if any(self.records(t, p) for p in self.runs.get(t, {}))]


def spec_text(spec, unit):
    def one(s):
        kind, v = s[0], s[1]
        num = f"{v:,}" if isinstance(v, int) else f"{v:g}"
        if kind == "max":
            return f"<= {num} {unit}".strip()
        if kind == "min":
            return f">= {num} {unit}".strip()
        if kind == "ratio_max":
            return f"<= {v:g}x native"
        if kind == "raw_min":
            return f">= {v * 100:.0f}% of raw stream"
        if kind == "rtt_max":
            return f"<= {v:g}x raw round trip p50"
        return "?"

    if not spec:
        return "-"
    so, sh = spec.get("sockets"), spec.get("shm")
    if so and sh and so == sh:
        return one(so)
    parts = []
    if so:
        parts.append(one(so) + " (sockets)")
    if sh:
        parts.append(one(sh) + " (shm)")
    return "; ".join(parts)


def build_rows(d):
    """The metrics of the table: each row has values per transport, ratios, target and verdicts."""
    rows = []

    def row(metric, unit, getter, spec=None, raw_key=None, higher=False, section=None):
        vals = {t: getter(t) for t in TRANSPORTS}
        rows.append({"metric": metric, "unit": unit, "values": vals, "spec": spec, "raw_key": raw_key,
                     "higher_is_better": higher, "section": section})

    v = d.value
    row("null call (cudaStreamQuery) p50", "us", lambda t: v(t, "micro", "null_call", "p50_us"),
        {"sockets": ("max", 25), "shm": ("max", 2)}, section="Latency")
    row("null call p99", "us", lambda t: v(t, "micro", "null_call", "p99_us"), {"sockets": ("max", 60), "shm": ("max", 10)})
    row("null call p99.9", "us", lambda t: v(t, "micro", "null_call", "p999_us"))
    row("empty launch + sync p50", "us", lambda t: v(t, "micro", "launch_sync", "p50_us"),
        {"sockets": ("max", 40), "shm": ("ratio_max", 1.2)})
    row("empty launch + sync p99", "us", lambda t: v(t, "micro", "launch_sync", "p99_us"))
    row("empty launch + sync p99.9", "us", lambda t: v(t, "micro", "launch_sync", "p999_us"))
    row("raw round trip p50 (64 B ping-pong; sockets: blocking reads; shm: spinning on a shared cache line)", "us",
        lambda t: d.rtt(t) if t in FLYT else None)
    row("raw round trip p99", "us", lambda t: d.rtt(t, field="p99_us") if t in FLYT else None)
    row("raw round trip p50, sockets busy-polling", "us", lambda t: d.rtt(t, "spin") if t in SOCKETS else None)

    def null_over_rtt(t):
        x, r = v(t, "micro", "null_call", "p50_us"), d.rtt(t)
        return x / r if x is not None and r else None

    def launch_over_native(t):
        x, n = v(t, "micro", "launch_sync", "p50_us"), v("native", "micro", "launch_sync", "p50_us")
        return x - n if t in FLYT and x is not None and n is not None else None

    row("null call p50 / raw round trip p50", "x", null_over_rtt, {"sockets": ("max", 1.2)})
    row("empty launch + sync p50 minus native's", "us", launch_over_native, {"sockets": ("rtt_max", 1.2)})
    row("client CPU per async launch (10k batch mean)", "us", lambda t: v(t, "micro", "cpu_per_launch", "mean_us"),
        {"sockets": ("max", 1.5), "shm": ("max", 1.5)})
    row("async launch, single call p99", "us", lambda t: v(t, "micro", "cpu_per_launch", "each_p99_us"))
    row("async launch, process CPU per launch", "us", lambda t: v(t, "micro", "cpu_per_launch", "process_cpu_us"))
    row("launches per second (100k, one sync)", "/s", lambda t: v(t, "micro", "launch_rate", "per_s"),
        {"sockets": ("min", 250000), "shm": ("min", 320000)}, higher=True)
    row("cudaMalloc + cudaFree 1 MiB p50", "us", lambda t: v(t, "micro", "malloc_free", "p50_us"))
    for mem in ["pageable", "pinned"]:
        for dr in ["H2D", "D2H"]:
            row(f"4 KiB sync copy {mem} {dr} p50", "us",
                lambda t, mem=mem, dr=dr: v(t, "copy", "copy_4k", "p50_us", mem=mem, dir=dr),
                {"sockets": ("max", 45), "shm": ("max", 12)})
    for nbytes in [64 * MiB, 256 * MiB]:
        for mem in ["pinned", "pageable"]:
            for dr in ["H2D", "D2H"]:
                shm_min = 50 if mem == "pinned" else 20
                row(f"copy {nbytes // MiB} MiB {mem} {dr}", "GB/s",
                    lambda t, mem=mem, dr=dr, n=nbytes: v(t, "copy", "copy", "gbps", mem=mem, dir=dr, bytes=n),
                    {"sockets": ("raw_min", 0.8), "shm": ("min", shm_min)},
                    raw_key=("c2s" if dr == "H2D" else "s2c", nbytes), higher=True,
                    section="Bandwidth" if (nbytes == 64 * MiB and mem == "pinned" and dr == "H2D") else None)
        row(f"copy {nbytes // MiB} MiB D2D", "GB/s",
            lambda t, n=nbytes: v(t, "copy", "copy", "gbps", mem="device", dir="D2D", bytes=n), higher=True)
    for nbytes in [64 * MiB, 256 * MiB]:
        for dr, name in [("c2s", "client->server"), ("s2c", "server->client")]:
            row(f"raw socket stream {nbytes // MiB} MiB {name}", "GB/s",
                lambda t, dr=dr, n=nbytes: d.raw(t, dr, n) if t in SOCKETS else None, higher=True)
    static = "Static runtime (nvcc's default: NVIDIA's runtime in the program, over Flyt's libcuda.so.1)"
    row("static runtime: null call (cudaStreamQuery) p50", "us", lambda t: v(t, "micro_static", "null_call", "p50_us"), section=static)
    row("static runtime: empty launch + sync p50", "us", lambda t: v(t, "micro_static", "launch_sync", "p50_us"))
    row("static runtime: empty launch + sync p99", "us", lambda t: v(t, "micro_static", "launch_sync", "p99_us"))
    row("static runtime: launches per second (100k, one sync)", "/s", lambda t: v(t, "micro_static", "launch_rate", "per_s"), higher=True)
    for mem in ["pinned", "pageable"]:
        for dr in ["H2D", "D2H"]:
            row(f"static runtime: copy 64 MiB {mem} {dr}", "GB/s",
                lambda t, mem=mem, dr=dr: v(t, "copy_static", "copy", "gbps", mem=mem, dir=dr, bytes=64 * MiB), higher=True)
    row("static runtime: compute-bound app (matmul), total", "s", lambda t: v(t, "matmul_static", "matmul", "total_s"))
    row("cuBLAS SGEMM 4096 (static runtime)", "GFLOP/s", lambda t: v(t, "cublas", "sgemm_4096", "gflops"), higher=True)
    row("cuBLAS: 1000 SGEMMs of 64x64 + sync, p50 (static runtime)", "ms", lambda t: v(t, "cublas", "small_gemms", "p50_ms"))

    def first_kernel(t, field):
        return d.across_runs(t, "first_kernel", "first_kernel", field, statistics.median)
    row("first CUDA call (cuInit, context; Flyt: server found, session up), median of runs 1 s apart", "ms",
        lambda t: first_kernel(t, "init_ms"))
    row("main to first kernel's result on the host, median of runs (warm server)", "ms",
        lambda t: first_kernel(t, "first_result_ms"))
    torch_section = "PyTorch (its bundled runtime over Flyt's libcuda.so.1; --python)"
    def best_of_runs(t, bench):
        # These VMs move a whole process's timings by 20-30% from one run to the next (native
        # too): each column shows the better of its two runs' medians.
        return d.across_runs(t, "torch", bench, "p50_ms", min)
    row("PyTorch: transformer training step (6 layers, d 512, batch 32 x 128), p50, better of 2 runs", "ms",
        lambda t: best_of_runs(t, "torch_train_step"), {"sockets": ("ratio_max", 1.5), "shm": ("ratio_max", 1.05)},
        section=torch_section)
    row("PyTorch: batch-1 inference of the same model, p50, better of 2 runs", "ms", lambda t: best_of_runs(t, "torch_infer_b1"),
        {"sockets": ("ratio_max", 2.5), "shm": ("ratio_max", 1.3)})
    row("PyTorch: script start to first result, second run (warm server and image cache)", "ms",
        lambda t: v(t, "torch", "torch_first_result", "ms", run=1))

    def first_result_over_native(t):
        x, n = v(t, "torch", "torch_first_result", "ms", run=1), v("native", "torch", "torch_first_result", "ms", run=1)
        return x - n if t != "native" and x is not None and n is not None else None
    row("PyTorch: the same minus native's", "ms", first_result_over_native, {"sockets": ("max", 1500), "shm": ("max", 1500)})
    row("PyTorch: module image bytes sent, first run", "bytes", lambda t: v(t, "torch", "images", "bytes", run=0))
    row("PyTorch: module image bytes sent, second run", "bytes", lambda t: v(t, "torch", "images", "bytes", run=1),
        {"sockets": ("max", 1 << 20), "shm": ("max", 1 << 20)})
    row("compute-bound app (matmul), total", "s", lambda t: v(t, "matmul", "matmul", "total_s"),
        {"sockets": ("ratio_max", 1.02), "shm": ("ratio_max", 1.01)}, section="Applications")
    row("launch-heavy app, per 10k launches + sync (mean)", "ms", lambda t: v(t, "launch_heavy", "launch_heavy", "round_mean_ms"),
        {"sockets": ("ratio_max", 2.0), "shm": ("ratio_max", 1.3)})
    row("graph of 1000 kernel nodes (stream capture): cudaGraphLaunch + sync p50", "us",
        lambda t: v(t, "graph", "graph_launch", "p50_us"), {"sockets": ("ratio_max", 1.1), "shm": ("ratio_max", 1.1)})
    row("graph of 1000 kernel nodes: cudaGraphLaunch + sync p99", "us", lambda t: v(t, "graph", "graph_launch", "p99_us"))
    row("graph of 1000 kernel nodes: cudaGraphLaunch call alone p50", "us",
        lambda t: v(t, "graph", "graph_launch", "call_p50_us"))
    row("graph of 1000 kernel nodes: cudaGraphInstantiate", "ms", lambda t: v(t, "graph", "graph_launch", "instantiate_ms"))
    row("graph comparison: the same 1000 kernels launched one by one + sync, p50", "ms",
        lambda t: v(t, "graph", "graph_vs_stream", "p50_ms"))
    row("graph of 1000 kernel nodes updated every step (capture + cudaGraphExecUpdate + launch + sync), p50", "ms",
        lambda t: v(t, "graph", "graph_update", "step_p50_ms"))
    row("the same: cudaGraphExecUpdate alone, p50", "ms", lambda t: v(t, "graph", "graph_update", "update_p50_ms"))
    row("CUDA IPC: cudaIpcOpenMemHandle of a handle the process has open (cached reopen) p50", "us",
        lambda t: v(t, "ipc", "ipc_reopen", "p50_us"), {"sockets": ("max", 5), "shm": ("max", 5)})
    row("CUDA IPC: cached reopen p99", "us", lambda t: v(t, "ipc", "ipc_reopen", "p99_us"))
    row("CUDA IPC: cudaIpcOpenMemHandle of a closed handle (a real mapping) p50", "us",
        lambda t: v(t, "ipc", "ipc_open", "p50_us"))
    row("CUDA IPC: the first open in a process", "us", lambda t: v(t, "ipc", "ipc_open", "first_us"))
    one_pct = {"sockets": ("max", 1), "shm": ("max", 1)}
    row("(a) app blocked 2 s in cudaDeviceSynchronize on a kernel: app CPU", "%",
        lambda t: v(t, "idle_cpu", "idle_blocked", "cpu_pct"), section="Idle CPU (% of one core)")
    row("(a) the same: server CPU (listener + the session's worker)", "%",
        lambda t: v(t, "idle_cpu", "idle_blocked", "server_cpu_pct"))
    row("(b) app between bursts (100 launches + sync each second), from 50 ms after a burst: app CPU", "%",
        lambda t: v(t, "idle_cpu", "idle_bursts", "after50_cpu_pct"), one_pct)
    row("(b) the same, whole gaps", "%", lambda t: v(t, "idle_cpu", "idle_bursts", "gap_cpu_pct"))
    row("(c) one idle session, 3 s from 200 ms after a burst: server CPU (listener + worker)", "%",
        lambda t: v(t, "idle_cpu", "idle_session", "server_cpu_pct"), one_pct)
    row("(c) the same: app CPU", "%", lambda t: v(t, "idle_cpu", "idle_session", "cpu_pct"), one_pct)
    row("(d) many idle sessions at once (5 s): server CPU per session (all server processes / sessions)", "%",
        lambda t: v(t, "idle_cpu", "idle_many", "server_cpu_pct_per_session"), one_pct)
    row("(d) the same: app CPU, mean over the apps", "%", lambda t: v(t, "idle_cpu", "idle_many", "app_cpu_pct_mean"),
        one_pct)
    row("(d) the same: app CPU, highest app", "%", lambda t: v(t, "idle_cpu", "idle_many", "app_cpu_pct_max"))
    sizes = sorted({r["bytes"] for t in TRANSPORTS for r in d.records(t, "pipeline")
                    if r.get("bench") == "pipeline" and "bytes" in r and "median_ms" in r})
    for n in sizes:
        row(f"pipeline {human_bytes(n)} (3 malloc, memset, 2 H2D, kernel, sync, 3 D2H)", "ms",
            lambda t, n=n: v(t, "pipeline", "pipeline", "median_ms", bytes=n))

    # ratios and verdicts
    matmul_reps = {t: v(t, "matmul", "matmul", "reps") for t in TRANSPORTS}
    for r in rows:
        vals, spec = r["values"], r["spec"] or {}
        nat = vals.get("native")
        r["ratios"], r["verdicts"], r["notes"] = {}, {}, {}
        for t in FLYT:
            x = vals.get(t)
            if x is not None and nat:
                if r["metric"].startswith("compute-bound") and matmul_reps.get(t) != matmul_reps.get("native"):
                    r["notes"][t] = "repetitions differ from native"
                else:
                    r["ratios"][t] = x / nat
            s = spec.get("shm" if t == "shm" else "sockets")
            if not s:
                continue
            if x is None:
                r["verdicts"][t] = "n/a"
                continue
            kind, lim = s
            if kind == "max":
                ok = x <= lim
            elif kind == "min":
                ok = x >= lim
            elif kind == "ratio_max":
                ratio = r["ratios"].get(t)
                ok = None if ratio is None else ratio <= lim
            elif kind == "rtt_max":
                rtt = d.rtt(t)
                if rtt:
                    r["notes"][t] = f"raw round trip {fmt_num(rtt)} us"
                ok = None if not rtt else x <= lim * rtt
            elif kind == "raw_min":
                raw = d.raw(t, *r["raw_key"]) if r["raw_key"] else None
                if raw:
                    r["notes"][t] = f"{100 * x / raw:.0f}% of raw"
                ok = None if not raw else x >= lim * raw
            else:
                ok = None
            r["verdicts"][t] = "n/a" if ok is None else ("PASS" if ok else "FAIL")
    return rows


def fmt_num(x):
    if x is None:
        return "n/a"
    a = abs(x)
    if a >= 10000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 10:
        return f"{x:.2f}"
    if a >= 0.01:
        return f"{x:.3f}"
    return f"{x:.3g}"


def short_bytes(x):
    n = int(round(x))
    for unit, s in [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")]:
        if n >= unit:
            return f"{n / unit:g}{s}"
    return f"{n}B"


def human_bytes(n):
    for unit, s in [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]:
        if n >= unit and n % unit == 0:
            return f"{n // unit} {s}"
    return f"{n} B"


def render_md(d, rows):
    meta = d.res.get("meta", {})
    gm = d.meta()
    lines = ["# Flyt benchmarks: native vs Flyt", ""]
    gpu = gm.get("gpu", "unknown GPU")
    extra = []
    if gm.get("sms"):
        extra.append(f"{gm['sms']} SMs")
    if gm.get("mem_mib"):
        extra.append(f"{gm['mem_mib'] / 1024:.0f} GiB")
    if gm.get("driver_version"):
        extra.append(f"driver API {gm['driver_version']}")
    if gm.get("runtime_version"):
        extra.append(f"runtime {gm['runtime_version']}")
    lines.append(f"- date: {meta.get('date_utc', '?')}; mode: {meta.get('mode', '?')}; "
                 f"harness time {meta.get('harness_s', '?')} s" +
                 ("; INTERRUPTED (incomplete)" if meta.get("interrupted") else ""))
    lines.append(f"- GPU: {gpu}" + (f" ({', '.join(extra)})" if extra else "") +
                 f"; host: {meta.get('cpus', '?')} CPUs, kernel {meta.get('kernel', '?')}")
    st = meta.get("transports", {})
    lines.append("- transports: " + ", ".join(f"{t} {st.get(t, 'n/a')}" for t in TRANSPORTS))
    if meta.get("app_env"):
        lines.append("- the Flyt columns' apps ran with " + " ".join(f"`{pair}`" for pair in meta["app_env"]))
    problems = []
    for t in TRANSPORTS:
        for prog, r in d.runs.get(t, {}).items():
            if prog == "probe" and not st.get(t, "ok").startswith("ok"):
                continue  # already said in the transports line
            if r.get("skipped"):
                problems.append(f"{t}/{prog} skipped ({r['skipped']})")
            elif r.get("timed_out"):
                problems.append(f"{t}/{prog} timed out")
            elif r.get("rc") not in (0, None):
                problems.append(f"{t}/{prog} exit {r['rc']}: {last_line(r.get('stderr_tail', ''))}")
            for rec in r.get("records", []):
                if rec.get("ok") is False:
                    problems.append(f"{t}/{prog}: WRONG RESULT in {rec.get('bench')}")
                if rec.get("error"):
                    problems.append(f"{t}/{prog}: {rec.get('bench')} failed: {rec['error']}")
    if problems:
        lines.append("- problems: " + "; ".join(problems))
    reps = d.value("native", "matmul", "matmul", "reps")
    if reps:
        n = d.value("native", "matmul", "matmul", "n")
        tf = d.value("native", "matmul", "matmul", "tflops")
        lines.append(f"- compute-bound app: {int(n or 0)}x{int(n or 0)} SGEMM x {int(reps)} "
                     f"({fmt_num(tf)} TFLOP/s native)")
    lines.append("- sockets = the Unix-socket and TCP-loopback columns; shm = Unix socket + shared-memory channel. "
                 "Ratio = Flyt / native. Raw stream = `raw_stream.c` over the same kind of socket, 1 MiB writes "
                 "(H2D compared with client->server, D2H with server->client).")
    rounds = {prog: len({r.get("round", 0) for r in d.records("native", prog)}) for prog in ROUNDS}
    for prog, n in rounds.items():
        if n > 1 and prog in ROUNDS_ARE_RUNS:
            lines.append(f"- `{prog}` ran in {n} rounds, each over every transport in turn; round k is its run k.")
        elif n > 1:
            lines.append(f"- `{prog}` ran in {n} rounds, each over every transport in turn; its rows show the median "
                         "over the rounds of each figure.")
    lines.append("")
    lines.append("| metric | native | unix | tcp | shm | ratio vs native | target | pass/fail |")
    lines.append("| --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
    for r in rows:
        if r.get("section"):
            lines.append(f"| **{r['section']}** | | | | | | | |")
        cells = []
        for t in TRANSPORTS:
            x = r["values"].get(t)
            c = fmt_num(x) if x is not None else ("-" if st.get(t, "").startswith("not requested") else "n/a")
            if x is not None and t in r["notes"] and "raw" in r["notes"][t]:
                c += f" ({r['notes'][t]})"
            cells.append(c)
        ratio = ", ".join(f"{t} {r['ratios'][t]:.2f}x" for t in FLYT if t in r["ratios"]) or "-"
        notes = [f"{t}: {r['notes'][t]}" for t in FLYT if t in r["notes"] and "raw" not in r["notes"][t]]
        if notes:
            ratio += " (" + "; ".join(notes) + ")"
        verdict = ", ".join(f"{t} {r['verdicts'][t]}" for t in FLYT if t in r["verdicts"]
                            and not st.get(t, "").startswith("not requested")) or "-"
        unit = f" ({r['unit']})" if r["unit"] else ""
        lines.append(f"| {r['metric']}{unit} | " + " | ".join(cells) +
                     f" | {ratio} | {spec_text(r['spec'], r['unit'])} | {verdict} |")
    lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# plots


def plots(d, out, log):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, FuncFormatter
    except Exception as e:  # noqa: BLE001 -- plots are optional
        log.append(f"plots skipped: matplotlib unavailable ({e})\n")
        return []
    written = []
    import math

    def save(fig, name, title=None):
        """Titles fig (when given a title), lays it out, writes it to OUT/NAME at 110 dpi and closes it."""
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        p = os.path.join(out, name)
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)

    def tx(p):
        return -math.log10(max(1e-5, 1 - p / 100.0))

    # latency distributions
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, bench, title in [(axes[0], "null_call", "synchronizing null call (cudaStreamQuery, idle stream)"),
                             (axes[1], "launch_sync", "empty kernel launch + cudaDeviceSynchronize")]:
        any_ = False
        for t in TRANSPORTS:
            r = d.find(t, "micro", bench)
            if not r or not r.get("cdf_p"):
                continue
            pts = [(tx(p), u) for p, u in zip(r["cdf_p"], r["cdf_us"]) if p < 100 and u is not None and u > 0]
            if not pts:
                continue
            ax.plot([a for a, _ in pts], [b for _, b in pts], color=COLORS[t],
                    label=f"{t} (p50 {fmt_num(r.get('p50_us'))}, p99 {fmt_num(r.get('p99_us'))} us)")
            any_ = True
        ticks = [0, 50, 90, 99, 99.9, 99.99]
        ax.xaxis.set_major_locator(FixedLocator([tx(p) for p in ticks]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{100 * (1 - 10 ** -x):.4g}"))
        ax.set_yscale("log")
        ax.set_xlabel("percentile")
        ax.set_ylabel("latency (us)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if any_:
            ax.legend(fontsize=8)
    save(fig, "latency.png", "Latency distribution per transport")

    # copy bandwidth
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    panels = [("pinned", "H2D", axes[0][0]), ("pinned", "D2H", axes[0][1]), ("device", "D2D", axes[0][2]),
              ("pageable", "H2D", axes[1][0]), ("pageable", "D2H", axes[1][1])]
    for mem, dr, ax in panels:
        for t in TRANSPORTS:
            pts = sorted((r["bytes"], r["gbps"]) for r in d.records(t, "copy")
                         if r.get("bench") == "copy" and r.get("mem") == mem and r.get("dir") == dr
                         and r.get("gbps"))
            if pts:
                ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", ms=3, color=COLORS[t], label=t)
        if dr in ("H2D", "D2H"):
            rd = "c2s" if dr == "H2D" else "s2c"
            for sock in SOCKETS:
                g = d.raw(sock, rd, 256 * MiB) or d.raw(sock, rd, 64 * MiB)
                if g:
                    ax.axhline(g, color=COLORS[sock], ls="--", lw=0.8, label=f"raw {sock} stream")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator([4 ** k for k in range(1, 15, 2)]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: short_bytes(x)))
        ax.set_yscale("log")
        ax.set_xlabel("bytes per cudaMemcpy")
        ax.set_ylabel("GB/s")
        ax.set_title(f"{mem} {dr}" if mem != "device" else "device to device", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    ax = axes[1][2]
    series = [("pageable", "H2D"), ("pageable", "D2H"), ("pinned", "H2D"), ("pinned", "D2H")]
    width = 0.2
    for i, t in enumerate(TRANSPORTS):
        ys = [d.value(t, "copy", "copy_4k", "p50_us", mem=m, dir=dr) for m, dr in series]
        if any(y is not None for y in ys):
            ax.bar([k + (i - 1.5) * width for k in range(len(series))], [y or 0 for y in ys], width,
                   color=COLORS[t], label=t)
    ax.set_xticks(range(len(series)))
    ax.set_xticklabels([f"{m}\n{dr}" for m, dr in series], fontsize=8)
    ax.set_ylabel("p50 latency (us)")
    ax.set_title("4 KiB synchronous cudaMemcpy", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    if ax.patches:
        ax.legend(fontsize=7)
    save(fig, "bandwidth.png", "cudaMemcpy bandwidth against size (median of repetitions)")

    # applications
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    nat = {r["bytes"]: r["median_ms"] for r in d.records("native", "pipeline")
           if r.get("bench") == "pipeline" and r.get("median_ms")}
    for t in TRANSPORTS:
        pts = sorted((r["bytes"], r["median_ms"]) for r in d.records(t, "pipeline")
                     if r.get("bench") == "pipeline" and r.get("median_ms"))
        if not pts:
            continue
        axes[0].plot([a for a, _ in pts], [b for _, b in pts], marker="o", ms=3, color=COLORS[t], label=t)
        if t != "native":
            rp = [(a, b / nat[a]) for a, b in pts if a in nat and nat[a]]
            if rp:
                axes[1].plot([a for a, _ in rp], [b for _, b in rp], marker="o", ms=3, color=COLORS[t], label=t)
    for ax, yl, title in [(axes[0], "wall time (ms)", "pipeline: wall time per size"),
                          (axes[1], "Flyt / native", "pipeline: ratio vs native")]:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: short_bytes(x)))
        if ax is axes[0]:
            ax.set_yscale("log")
        ax.set_xlabel("bytes per buffer")
        ax.set_ylabel(yl)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    axes[1].axhline(1.0, color="black", lw=0.8)
    ax = axes[2]
    apps = [("matmul", "matmul", "total_s", "compute-bound", (1.02, 1.01)),
            ("launch_heavy", "launch_heavy", "round_mean_ms", "launch-heavy", (2.0, 1.3))]
    for i, t in enumerate(FLYT):
        ys = []
        for prog, bench, field, _, _ in apps:
            a_, b_ = d.value(t, prog, bench, field), d.value("native", prog, bench, field)
            ys.append(a_ / b_ if a_ and b_ else 0)
        if any(ys):
            bars = ax.bar([k + (i - 1) * 0.25 for k in range(len(apps))], ys, 0.25, color=COLORS[t], label=t)
            ax.bar_label(bars, labels=[f"{y:.3f}" if y else "" for y in ys], fontsize=7)
    for k, (_, _, _, _, (sock_t, shm_t)) in enumerate(apps):
        ax.hlines(sock_t, k - 0.4, k + 0.4, colors="red", linestyles="--", lw=1)
        ax.hlines(shm_t, k - 0.4, k + 0.4, colors="green", linestyles=":", lw=1)
    ax.set_xticks(range(len(apps)))
    ax.set_xticklabels([x[3] for x in apps])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel("Flyt / native (lower is better)")
    ax.set_title("applications vs native (red: socket target, green: shm target)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    if ax.patches:
        ax.legend(fontsize=8)
    save(fig, "apps.png")
    return written


# ----------------------------------------------------------------------------------------------------------
# writing the results folder


def write_report(results, out, log_blocks=None, stats_text=None):
    os.makedirs(out, exist_ok=True)
    d = Data(results)
    rows = build_rows(d)
    results["table"] = [{k: r[k] for k in ("metric", "unit", "values", "ratios", "verdicts", "notes")} |
                        {"target": spec_text(r["spec"], r["unit"])} for r in rows]
    md = render_md(d, rows)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(md)
    log = list(log_blocks or [])
    plots(d, out, log)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=False)
        f.write("\n")
    if stats_text is not None:
        with open(os.path.join(out, "flyt_stats.txt"), "w") as f:
            f.write(stats_text)
    if log_blocks is not None:
        with open(os.path.join(out, "log.txt"), "w") as f:
            f.write("".join(log))
    return md


def stats_file_text(runner):
    parts = []
    for t, r in runner.stats_runs.items():
        state = r.get("skipped") or ("timed out" if r.get("timed_out") else f"exit status {r.get('rc')}")
        parts.append(f"===== {t}: FLYT_STATS=1 {' '.join(r.get('cmd', []))} ({state}, {r.get('wall_s')} s)\n")
        parts.append(tail(r.get("stderr", ""), 2_000_000))
        parts.append("\n")
    if not parts:
        parts.append("No FLYT_STATS run: no Flyt transport worked, or launch_heavy was not among the programs.\n")
    return "".join(parts)


def cmd_run(a):
    a.transports = [t.strip() for t in a.transports.split(",") if t.strip()]
    bad = [t for t in a.transports if t not in TRANSPORTS]
    if bad:
        sys.exit(f"harness: unknown transport(s) {bad}; choose from {TRANSPORTS}")
    a.programs = [p.strip() for p in a.programs.split(",") if p.strip()] if a.programs else []
    a.dist_ok, a.dist_problem = True, ""
    if any(t != "native" for t in a.transports):
        if not a.unix_addr or not a.tcp_addr:
            a.dist_ok, a.dist_problem = False, "flyt-rpc-server did not start"
        elif not os.path.exists(os.path.join(a.dist, "lib", "libcudart.so.13")):
            a.dist_ok, a.dist_problem = False, f"{a.dist}/lib/libcudart.so.13 missing"
    r = Runner(a)
    r.run_all()
    results = r.results()
    md = write_report(results, a.out, r.log, stats_file_text(r))
    print(f"harness: wrote {a.out} in {time.monotonic() - r.t0:.0f} s", file=sys.stderr)
    return md


def load_lines_dir(path):
    """DIR/<transport>/<program>.jsonl (+ DIR/raw_stream.jsonl) -> a results dict."""
    res = {"meta": {"date_utc": "synthetic", "mode": "test", "transports": {}}, "raw_stream": [], "runs": {}}
    raw = os.path.join(path, "raw_stream.jsonl")
    if os.path.exists(raw):
        res["raw_stream"] = [json.loads(x) for x in open(raw) if x.strip().startswith("{")]
    rtt = os.path.join(path, "raw_rtt.jsonl")
    if os.path.exists(rtt):
        res["raw_rtt"] = [json.loads(x) for x in open(rtt) if x.strip().startswith("{")]
    for t in TRANSPORTS:
        td = os.path.join(path, t)
        if not os.path.isdir(td):
            res["meta"]["transports"][t] = "n/a: no data"
            continue
        res["meta"]["transports"][t] = "ok"
        res["runs"][t] = {}
        for fn in sorted(os.listdir(td)):
            if fn.endswith(".jsonl"):
                recs = [json.loads(x) for x in open(os.path.join(td, fn)) if x.strip().startswith("{")]
                res["runs"][t][fn[:-6]] = {"rc": 0, "records": recs}
    return res


def app_env_pair(text):
    """`NAME=VALUE` of --app-env, as a pair."""
    name, sep, value = text.partition("=")
    if not sep or not name or not (name[0].isalpha() or name[0] == "_") or not name.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the benchmarks and write the results folder")
    r.add_argument("--build", required=True, help="folder with the compiled benchmark programs")
    r.add_argument("--out", required=True)
    r.add_argument("--dist", default="dist")
    r.add_argument("--transports", default="native,unix,tcp,shm")
    r.add_argument("--programs", default="", help="comma list (default: all) of " + ",".join(ORDER))
    r.add_argument("--quick", action="store_true")
    r.add_argument("--unix-addr", default="", help="FLYT_SERVER value for the Unix socket, e.g. unix:/tmp/x/flyt.sock")
    r.add_argument("--tcp-addr", default="", help="FLYT_SERVER value for TCP, e.g. 127.0.0.1:40000")
    r.add_argument("--server-pid", type=int, default=0)
    r.add_argument("--cuda-lib", default="/usr/local/cuda/lib64", help="LD_LIBRARY_PATH for native runs")
    r.add_argument("--raw-stream", default="", help="the compiled raw_stream program")
    r.add_argument("--raw-rtt", default="", help="the compiled raw_rtt program")
    r.add_argument("--server-log", default="", help="the server's log (stderr), to find each session's worker")
    r.add_argument("--budget-s", type=float, default=400.0, help="stop starting runs after this many seconds")
    r.add_argument("--python", default="", help="a Python with PyTorch, for the torch program (none: it is skipped)")
    r.add_argument("--app-env", action="append", default=[], type=app_env_pair, metavar="NAME=VALUE",
                   help="set in the Flyt columns' apps (repeatable); other FLYT_ variables are kept from them")
    p = sub.add_parser("report", help="render the results folder from saved data")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--from", dest="src", help="a results.json")
    g.add_argument("--lines-dir", help="DIR/<transport>/<program>.jsonl files")
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.cmd == "run":
        md = cmd_run(a)
    else:
        if a.src:
            with open(a.src) as f:
                results = json.load(f)
        else:
            results = load_lines_dir(a.lines_dir)
        md = write_report(results, a.out)
    print(md)


if __name__ == "__main__":
    main()
