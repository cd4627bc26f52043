"""All-reduce speed of NCCL with every GPU in one process (`torch.cuda.nccl.all_reduce`, NCCL's
ncclCommInitAll path): one float32 tensor per GPU, 5 warm-up all-reduces then 30 timed ones (each
synchronized on every GPU); prints the median and p99 time and the bus bandwidth as NCCL's tests
count it (2 (n-1)/n x bytes / time). Run natively and through Flyt by benchmarks/multi_gpu.sh."""
import statistics
import time

import torch
import torch.cuda.nccl as nccl

n = torch.cuda.device_count()
if n < 2:
    raise SystemExit(f"nccl_single_process: needs two GPUs, {n} seen")


def synchronize():
    for d in range(n):
        torch.cuda.synchronize(d)


for size in [1 << 20, 16 << 20, 256 << 20]:
    tensors = [torch.ones(size // 4, device=f"cuda:{d}", dtype=torch.float32) for d in range(n)]
    for _ in range(5):
        nccl.all_reduce(tensors)
    synchronize()
    times = []
    for _ in range(30):
        start = time.perf_counter()
        nccl.all_reduce(tensors)
        synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    p50, p99 = statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]
    busbw = 2 * (n - 1) / n * size / p50 / 1e9
    print(f"single-process all_reduce {size >> 20} MiB over {n} GPUs: p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms, bus bandwidth {busbw:.1f} GB/s", flush=True)
