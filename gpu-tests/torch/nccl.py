"""PyTorch's nccl backend through Flyt, one process per GPU: a process group of one rank (one GPU
per tenant today), an all-reduce, a broadcast, an all-gather and a reduce-scatter on CUDA tensors,
each checked against the expected values. The group meets over a store on the loopback
interface; NCCL's own traffic stays in the process."""
import os
import sys

import torch
import torch.distributed as dist


def say(*parts):
    print(*parts, flush=True)


os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
world = dist.get_world_size()
say("backend:", dist.get_backend(), "world size:", world)

x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
dist.all_reduce(x)
ok_reduce = bool(torch.equal(x, torch.arange(1 << 20, device="cuda", dtype=torch.float32) * world))
say("all_reduce:", "right" if ok_reduce else "WRONG")

y = torch.full((4096,), 7.0, device="cuda")
dist.broadcast(y, src=0)
ok_broadcast = bool((y == 7.0).all())
say("broadcast:", "right" if ok_broadcast else "WRONG")

parts = [torch.empty(1000, device="cuda") for _ in range(world)]
dist.all_gather(parts, torch.full((1000,), 3.0, device="cuda"))
ok_gather = all(bool((p == 3.0).all()) for p in parts)
say("all_gather:", "right" if ok_gather else "WRONG")

out = torch.empty(512, device="cuda")
dist.reduce_scatter_tensor(out, torch.ones(512 * world, device="cuda"))
ok_scatter = bool((out == float(world)).all())
say("reduce_scatter:", "right" if ok_scatter else "WRONG")

torch.cuda.synchronize()
dist.destroy_process_group()
ok = ok_reduce and ok_broadcast and ok_gather and ok_scatter
say("nccl:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
