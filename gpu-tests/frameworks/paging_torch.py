"""PyTorch tenants taking turns on one GPU (issue 49, docs/design/paging.md): PROCESSES processes,
each holding FRACTION of the GPU's memory in tensors (an MLP, its Adam state and padding tensors of
known contents), take turns to train (one busy at a time, a turn token passed round through
pipes), STEPS steps a turn, TURNS turns each, and print every step's loss. Through a server with
`--oversubscribe 2.0` they fit together only by being paged out while they wait for their turn;
their losses must equal those of each process run alone (`--only I`) natively: the same seed,
data and deterministic kernels (`torch.use_deterministic_algorithms(True)`,
`CUBLAS_WORKSPACE_CONFIG=:4096:8`, no TF32). Each turn also checks every padding word (a paged
byte put back wrong shows). gpu-tests/paging-torch.sh runs the comparison on a GPU machine.

  paging_torch.py [--processes 3] [--fraction 0.05 | --bytes B] [--turns 2] [--steps 5]
                  [--only I] [--exact]

With no arguments (as gpu-tests/run.sh runs it, fw_paging_torch) the processes fit together
without paging (3 x 0.05: run.sh runs three transports at once); losses print to 5 significant
digits unless --exact (full precision, for paging-torch.sh's comparison). A process that fails
ends the run at once: the parent stops the others and exits non-zero. Last line:
"paging_torch: PASS"."""
import argparse
import os
import select
import subprocess
import sys
import time

TURN_TIMEOUT_S = 900  # a turn's page-in of 80 GiB through a memory file takes about a minute
PAD_TENSOR = 1 << 28  # int32 words per padding tensor: 1 GiB
CHECK_SLICE = 1 << 26  # words checked at once (256 MiB of expected words, reused)
WIDTH, DEPTH, BATCH = 2048, 6, 1024


def say(*parts):
    print(*parts, flush=True)


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.05, help="of the GPU's memory (mem_get_info's total), per process")
    parser.add_argument("--bytes", type=int, default=0, help="bytes per process (overrides --fraction)")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="training steps per turn")
    parser.add_argument("--only", type=int, default=-1, help="run only process I (all its turns, alone)")
    parser.add_argument("--exact", action="store_true", help="losses in full precision")
    parser.add_argument("--child", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--turn-fd", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--done-fd", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.processes <= 16 or not 0 < args.fraction <= 1 or args.turns < 1 or args.steps < 1:
        parser.error("processes 1-16, fraction in (0, 1], turns and steps >= 1")
    if args.only >= args.processes:
        parser.error("--only: no such process")
    return args


def wait_byte(fd, timeout):
    """One byte from fd within timeout: False on end of file (the other side died) or timeout."""
    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready) and os.read(fd, 1) == b"t"


# ---- a child: one tenant ----------------------------------------------------------------------


def child(args):
    # Deterministic kernels, set before CUDA starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    index = args.child
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if not wait_byte(args.turn_fd, TURN_TIMEOUT_S):
        return 3
    dev = torch.device("cuda")
    torch.manual_seed(1000 + index)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1)).to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    target_weights = torch.randn(WIDTH, 1, generator=torch.Generator().manual_seed(2000 + index)).to(dev)

    def batch(step):
        generator = torch.Generator(device=dev).manual_seed(index * 1_000_003 + step)
        x = torch.randn(BATCH, WIDTH, device=dev, generator=generator)
        return x, torch.tanh(x @ target_weights / WIDTH**0.5)

    def train(step):
        x, y = batch(step)
        optimizer.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    # One step's worth of memory first (activations, gradients, Adam's state), then padding up to
    # the process's share, in 1 GiB tensors of known words.
    first_loss = train(0)
    expected = torch.empty(CHECK_SLICE, dtype=torch.int32, device=dev)
    torch.cuda.synchronize()
    share = args.bytes or int(torch.cuda.mem_get_info()[1] * args.fraction)
    padding_words = max(0, share - torch.cuda.memory_reserved()) // 4
    padding = []
    while padding_words > 0:
        words = min(PAD_TENSOR, padding_words)
        base = len(padding) * 7919
        padding.append(torch.arange(base, base + words, dtype=torch.int32, device=dev))
        padding_words -= words
    torch.cuda.synchronize()
    share_text = f"{round(args.bytes / 2**30, 2)} GiB" if args.bytes else f"{args.fraction} of the GPU's memory"
    say(f"process {index}: holds {share_text}")
    # The padding's size depends on what the device reports: not in the compared output.
    print(f"process {index}: {len(padding)} padding tensors, {torch.cuda.memory_reserved() / 2**30:.2f} GiB reserved",
          file=sys.stderr, flush=True)

    def padding_intact():
        for number, tensor in enumerate(padding):
            base = number * 7919
            for start in range(0, tensor.numel(), CHECK_SLICE):
                part = tensor[start:start + CHECK_SLICE]
                torch.arange(base + start, base + start + part.numel(), dtype=torch.int32, device=dev, out=expected[:part.numel()])
                if not torch.equal(part, expected[:part.numel()]):
                    return False
        return True

    fmt = repr if args.exact else (lambda value: f"{value:.5g}")
    failures = 0
    step = 1
    say(f"process {index} step 0: loss {fmt(first_loss)}")
    os.write(args.done_fd, b"t")
    for turn in range(args.turns):
        if not wait_byte(args.turn_fd, TURN_TIMEOUT_S):
            return 3
        started = time.monotonic()
        torch.cuda.synchronize()  # the turn's first call: the page-in, through an oversubscribed server
        first_ms = (time.monotonic() - started) * 1e3
        for _ in range(args.steps):
            say(f"process {index} turn {turn} step {step}: loss {fmt(train(step))}")
            step += 1
        intact = padding_intact()
        say(f"process {index} turn {turn}: padding {'intact' if intact else 'CHANGED'}")
        failures += not intact
        torch.cuda.synchronize()  # idle between turns: nothing queued, so it may be paged out
        print(f"process {index} turn {turn}: first call {first_ms:.1f} ms, turn {(time.monotonic() - started) * 1e3:.0f} ms",
              file=sys.stderr, flush=True)
        os.write(args.done_fd, b"t")
    return 1 if failures else 0


# ---- the parent: passes the turn token round (no CUDA here) ------------------------------------


def parent(args):
    who = [args.only] if args.only >= 0 else list(range(args.processes))
    say(f"{len(who)} process{'es' if len(who) > 1 else ''}, {args.turns} turns of {args.steps} steps each")
    children = {}
    for index in who:
        turn_r, turn_w = os.pipe()
        done_r, done_w = os.pipe()
        command = [sys.executable, os.path.abspath(__file__), "--child", str(index), "--turn-fd", str(turn_r),
                   "--done-fd", str(done_w), "--turns", str(args.turns), "--steps", str(args.steps),
                   "--fraction", str(args.fraction), "--bytes", str(args.bytes)] + (["--exact"] if args.exact else [])
        # Only its own pipe ends: a child holding another's would keep that one's token pipe open.
        process = subprocess.Popen(command, pass_fds=(turn_r, done_w))
        os.close(turn_r)
        os.close(done_w)
        children[index] = (process, turn_w, done_r)
    lost = None
    for turn in range(-1, args.turns):
        for index in who:
            process, turn_w, done_r = children[index]
            try:
                os.write(turn_w, b"t")
                finished = wait_byte(done_r, TURN_TIMEOUT_S)
            except OSError:
                finished = False
            if not finished:
                say(f"FAIL: process {index} did not finish its turn {turn}")
                lost = index
                break
        if lost is not None:
            break
    failed = lost is not None
    if failed:
        # The others wait for turns that will not come: stopped now, not at a timeout.
        for index, (process, _, _) in children.items():
            if index != lost:
                process.kill()
    for index, (process, turn_w, done_r) in children.items():
        os.close(turn_w)
        os.close(done_r)
        try:
            status = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            status = process.wait()
        if failed and index != lost:
            continue
        if status != 0:
            say(f"FAIL: process {index} ended with status {status}")
            failed = True
    say("paging_torch: FAIL" if failed else "paging_torch: PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    ARGS = parse()
    sys.exit(child(ARGS) if ARGS.child >= 0 else parent(ARGS))
