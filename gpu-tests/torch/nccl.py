"""PyTorch's nccl backend through Flyt, one process per GPU: a process group of one rank (one GPU
per tenant), or of WORLD_SIZE ranks started by gpu-tests/nccl-ranks.sh (RANK, and DEVICE: the
process's device among the allocation's GPUs, which every rank sees); an all-reduce, a broadcast,
an all-gather and a reduce-scatter on CUDA tensors, each checked against the expected values. The
group meets over a store on the loopback interface."""
import os
import sys

import torch
import torch.distributed as dist


def say(*parts):
    print(*parts, flush=True)


os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
rank = int(os.environ.get("RANK", "0"))
device = int(os.environ.get("DEVICE", "0"))
torch.cuda.set_device(device)
dist.init_process_group("nccl", rank=rank, world_size=int(os.environ.get("WORLD_SIZE", "1")), device_id=torch.device("cuda", device))
world = dist.get_world_size()
say("backend:", dist.get_backend(), "world size:", world)

# Each rank contributes its own values: rank r adds r to every element of its tensor.
x = torch.arange(1 << 20, device="cuda", dtype=torch.float32) + rank
dist.all_reduce(x)
expected = torch.arange(1 << 20, device="cuda", dtype=torch.float32) * world + world * (world - 1) / 2
ok_reduce = bool(torch.equal(x, expected))
say("all_reduce:", "right" if ok_reduce else "WRONG")

y = torch.full((4096,), 7.0 + rank, device="cuda")
dist.broadcast(y, src=0)
ok_broadcast = bool((y == 7.0).all())
say("broadcast:", "right" if ok_broadcast else "WRONG")

parts = [torch.empty(1000, device="cuda") for _ in range(world)]
dist.all_gather(parts, torch.full((1000,), 3.0 + rank, device="cuda"))
ok_gather = all(bool((p == 3.0 + r).all()) for r, p in enumerate(parts))
say("all_gather:", "right" if ok_gather else "WRONG")

out = torch.empty(512, device="cuda")
dist.reduce_scatter_tensor(out, torch.ones(512 * world, device="cuda") * (rank + 1))
ok_scatter = bool((out == float(world * (world + 1) / 2)).all())
say("reduce_scatter:", "right" if ok_scatter else "WRONG")

torch.cuda.synchronize()
dist.destroy_process_group()
ok = ok_reduce and ok_broadcast and ok_gather and ok_scatter
say("nccl:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
