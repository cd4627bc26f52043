"""A PyTorch program holding a CUDA graph (torch.cuda.CUDAGraph: a small MLP captured after
warm-up, its memory in the graph's private pool) to move while it replays (gpu-tests/migrate.sh,
row "torch-graph"). Every round writes a new input into the graph's static input, replays it and
adds the static output into an accumulator; every tenth round prints the accumulator's sum. The
same kernels run natively and through Flyt, so the output is the same, moved or not. The static
tensors' pointers are printed at the start and at the end ("pointers: ...").

Arguments: rounds, milliseconds between rounds, and a gate file: halfway, the program keeps
replaying the graph until that file exists, so a script can move it while replays are in flight.
"""
import os
import sys
import time

import torch

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
pause = (int(sys.argv[2]) if len(sys.argv) > 2 else 10) / 1000
gate = sys.argv[3] if len(sys.argv) > 3 else None

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).cuda()
static_in = torch.zeros(64, 256, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side), torch.no_grad():
    for _ in range(3):
        model(static_in)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph), torch.no_grad():
    static_out = model(static_in)

pointers = f"pointers: {static_in.data_ptr():#x} {static_out.data_ptr():#x}"
print(pointers, flush=True)
base = torch.arange(64 * 256, device="cuda", dtype=torch.float32).reshape(64, 256) / (64 * 256)
acc = torch.zeros(64, 256, device="cuda")
for round_ in range(1, rounds + 1):
    static_in.copy_(base * (round_ % 13) - 0.5)
    graph.replay()
    acc += static_out
    if gate and round_ == rounds // 2:
        print(f"holding until {gate} exists", file=sys.stderr, flush=True)
        spins = 0
        while not os.path.exists(gate):
            graph.replay()
            spins += 1
            if spins % 16 == 0:
                torch.cuda.synchronize()
        graph.replay()  # static_out as this round left it
    if round_ % 10 == 0:
        print(f"round {round_}: {acc.double().sum().item():.9e}", flush=True)
    time.sleep(pause)
torch.cuda.synchronize()
print(f"pointers: {static_in.data_ptr():#x} {static_out.data_ptr():#x}")
print("PASSED")
