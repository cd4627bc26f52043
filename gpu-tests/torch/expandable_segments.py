"""PyTorch's expandable segments through Flyt (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, set
before torch starts CUDA): the caching allocator reserves address space once and maps physical memory
into it as it grows (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess) and unmaps it on
empty_cache (cuMemUnmap, cuMemRelease). Tensors of 1 MiB to 1 GiB kept alive while growing, then
allocated and freed one at a time while shrinking, values checked exactly after computing on them;
memory_allocated and memory_reserved followed (printed as booleans); empty_cache gives the memory back
and a second growth maps it again; a small MLP trained 20 steps."""
import os

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import sys  # noqa: E402

import torch  # noqa: E402

from helpers.training import step_losses  # noqa: E402


def say(*parts):
    print(*parts, flush=True)


MiB = 1 << 20
SIZES = [MiB << k for k in range(11)]  # 1 MiB .. 1 GiB


def checked_tensor(nbytes, k):
    """An int32 tensor of nbytes computed on the GPU, and whether its values are exactly right."""
    n = nbytes // 4
    t = torch.arange(n, dtype=torch.int32, device="cuda")
    t.mul_(3).add_(k)
    ok = int(t[-1]) == 3 * (n - 1) + k and bool(((t - k) % 3 == 0).all()) and int(t[n // 2]) == 3 * (n // 2) + k
    return t, ok


ok = True


def verdict(label, value):
    global ok
    say(f"{label}:", value)
    ok &= bool(value)


torch.manual_seed(0)
torch.cuda.init()
base_alloc = torch.cuda.memory_allocated()

# Growing: every tensor stays alive.
kept, values_ok, allocated, reserved = [], [], [], []
for k, size in enumerate(SIZES):
    t, good = checked_tensor(size, k)
    kept.append(t)
    values_ok.append(good)
    allocated.append(torch.cuda.memory_allocated())
    reserved.append(torch.cuda.memory_reserved())
verdict("growing: values exact", all(values_ok))
verdict("allocated grows as tensors grow", all(b > a for a, b in zip(allocated, allocated[1:])))
verdict("reserved grows as tensors grow", all(b >= a for a, b in zip(reserved, reserved[1:])) and reserved[-1] > reserved[0])
verdict("reserved >= allocated", all(r >= a for a, r in zip(allocated, reserved)))
verdict("allocated holds all tensors", allocated[-1] - base_alloc >= sum(SIZES))
snapshot = torch.cuda.memory_snapshot()
verdict("segments are expandable", len(snapshot) > 0 and all(s.get("is_expandable", False) for s in snapshot))
peak_reserved = torch.cuda.memory_reserved()
del t
kept.clear()
torch.cuda.synchronize()
verdict("allocated back to the start after freeing", torch.cuda.memory_allocated() == base_alloc)

# Shrinking: one tensor at a time, freed before the next; the pool already holds the memory.
values_ok, reserved = [], []
for k, size in enumerate(reversed(SIZES)):
    t, good = checked_tensor(size, k + 20)
    values_ok.append(good)
    del t
    reserved.append(torch.cuda.memory_reserved())
verdict("shrinking: values exact", all(values_ok))
verdict("reserved does not grow as tensors shrink", all(r <= peak_reserved for r in reserved))

# empty_cache unmaps the free pages; a second growth maps memory again.
before = torch.cuda.memory_reserved()
torch.cuda.empty_cache()
after = torch.cuda.memory_reserved()
verdict("memory returned after empty_cache", after < before and after <= torch.cuda.memory_allocated() + 64 * MiB)
values_ok = []
for k, size in enumerate(SIZES[::2]):
    t, good = checked_tensor(size, k + 40)
    kept.append(t)
    values_ok.append(good)
verdict("growing again after empty_cache: values exact", all(values_ok))
verdict("reserved grew again", torch.cuda.memory_reserved() > after)
# Copies across what were separate mappings: the largest tensor, round trip through the host.
big = kept[-1]
host = big.cpu()
verdict("1 GiB tensor round trip exact", torch.equal(host.cuda(), big))
del t, big, host
kept.clear()
torch.cuda.empty_cache()

# A small MLP, 20 steps of SGD with a fixed seed.
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = step_losses(model, opt, (512, 64), 20)
verdict("mlp loss fell over 20 steps", losses[-1] < losses[0])

torch.cuda.synchronize()
say("expandable_segments:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
