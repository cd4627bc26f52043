"""All-reduce speed through PyTorch's nccl backend, one process per GPU, started by
gpu-tests/nccl-ranks.sh --script (RANK, WORLD_SIZE, DEVICE as there). For each size: 5 warm-up
all-reduces, then 30 timed ones (each synchronized); prints the median and p99 time and the bus
bandwidth NCCL's tests report (2 (n-1)/n x bytes / time). Timings vary: the runner does not
compare them with the native run's, it prints both."""
import os
import statistics
import time

import torch
import torch.distributed as dist

rank = int(os.environ.get("RANK", "0"))
device = int(os.environ.get("DEVICE", "0"))
torch.cuda.set_device(device)
dist.init_process_group("nccl", rank=rank, world_size=int(os.environ.get("WORLD_SIZE", "1")), device_id=torch.device("cuda", device))
world = dist.get_world_size()

for size in [1 << 20, 16 << 20, 256 << 20]:
    x = torch.ones(size // 4, device="cuda", dtype=torch.float32)
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(30):
        start = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    p50, p99 = statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]
    busbw = 2 * (world - 1) / world * size / p50 / 1e9
    if rank == 0:
        print(f"all_reduce {size >> 20} MiB: p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms, bus bandwidth {busbw:.1f} GB/s", flush=True)
dist.destroy_process_group()
