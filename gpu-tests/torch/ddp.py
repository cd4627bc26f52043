"""PyTorch DDP as `torchrun --nproc-per-node N` runs it, N = every GPU the process sees: a small
transformer language model trained for 30 steps, each rank on its own shard of random tokens,
gradients all-reduced by NCCL. Rank 0 prints the device count and each step's loss (averaged over
the ranks); they are compared with the native run's. Run without torchrun's variables, the script
starts torchrun itself (`python -m torch.distributed.run --standalone`), as a user would.

DDP_TIMES=1 also times 40 more steps (after 10 warm-up ones, each synchronized) and prints their
median and p99 (for benchmarks, not compared)."""
import os
import statistics
import subprocess
import sys
import time

import torch

if "LOCAL_RANK" not in os.environ:
    n = torch.cuda.device_count()
    print("devices:", n, flush=True)
    if n < 2:
        print("ddp: needs two GPUs", flush=True)
        sys.exit(1)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", __file__]
    sys.exit(subprocess.run(command, timeout=600).returncode)

import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
# The math attention: deterministic, where the fused kernels' backward passes may not be.
torch.backends.cuda.enable_flash_sdp(False)
torch.backends.cuda.enable_mem_efficient_sdp(False)

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
rank, world = dist.get_rank(), dist.get_world_size()

VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 1024, 256, 8, 4, 128, 16


class LanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(SEQ, WIDTH) * 0.02)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position
        return self.head(self.blocks(x, mask=self.mask, is_causal=True))


torch.manual_seed(0)
model = DistributedDataParallel(LanguageModel().cuda(), device_ids=[local_rank])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1000 + rank)


def step():
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=data).cuda(non_blocking=True)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


if rank == 0:
    print("world size:", world, "devices:", torch.cuda.device_count(), flush=True)
for i in range(30):
    loss = step()
    dist.all_reduce(loss)
    if rank == 0:
        print(f"step {i:2d} loss {loss.item() / world:.6f}", flush=True)

if os.environ.get("DDP_TIMES") == "1":
    times = []
    for i in range(50):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= 10:
            times.append(time.perf_counter() - start)
    times.sort()
    if rank == 0:
        p50, p99 = statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]
        print(f"ddp step: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms", flush=True)
dist.destroy_process_group()
if rank == 0:
    print("ddp: done", flush=True)
