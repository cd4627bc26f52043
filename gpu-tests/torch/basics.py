"""PyTorch basics through Flyt: device queries, copies (pageable, pinned, non_blocking), elementwise
ops, reductions, indexing, an fp32 matmul, streams and events, and a small MLP trained 50 steps. Prints facts and values that native and Flyt runs must agree on;
floating-point results are printed rounded to what cuBLAS's algorithm choices cannot change."""
import sys

import torch

from helpers.training import step_losses


def say(*parts):
    print(*parts, flush=True)


def close(a, b, tol):
    return bool(torch.allclose(a.float().cpu(), b.float().cpu(), rtol=tol, atol=tol))


torch.manual_seed(0)
say("cuda available:", torch.cuda.is_available())
say("device count:", torch.cuda.device_count())
props = torch.cuda.get_device_properties(0)
say("name:", props.name)
say("capability:", torch.cuda.get_device_capability(0))
say("multiprocessors > 0:", props.multi_processor_count > 0)
free, total = torch.cuda.mem_get_info()
say("mem_get_info: 0 < free <= total:", 0 < free <= total)

# Copies: pageable, pinned, non_blocking, both directions; exact round trips.
host = torch.randn(1 << 20)
dev = host.cuda()
say("pageable round trip exact:", torch.equal(dev.cpu(), host))
pinned = torch.empty_like(host).pin_memory()
pinned.copy_(host)
dev2 = pinned.to("cuda", non_blocking=True)
back = torch.empty_like(host).pin_memory()
back.copy_(dev2, non_blocking=True)
torch.cuda.synchronize()
say("pinned non_blocking round trip exact:", torch.equal(back, host))

# Elementwise, reductions, indexing.
x = torch.arange(1000, dtype=torch.float32, device="cuda")
say("sum:", float(x.sum()))
say("max, argmax:", float(x.max()), int(x.argmax()))
say("mean of squares:", round(float((x * x).mean()), 3))
idx = torch.tensor([3, 1, 999, 0], device="cuda")
say("gather:", x[idx].tolist())
y = x.clone()
y[x % 7 == 0] = -1
say("masked writes:", int((y == -1).sum()))
say("cumsum last:", float(torch.cumsum(x, 0)[-1]))
say("sort desc first:", torch.sort(x, descending=True).values[:3].tolist())

# Matmul (more shapes and precisions: matmul.py).
a = torch.randn(256, 192)
b = torch.randn(192, 128)
want = (a.double() @ b.double()).float()
say("matmul fp32 close:", close(a.cuda() @ b.cuda(), want, 1e-4))

# Streams and events.
s = torch.cuda.Stream()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
with torch.cuda.stream(s):
    start.record()
    z = torch.ones(1 << 20, device="cuda") * 3
    end.record()
end.synchronize()
say("stream result:", float(z.sum()))
say("event elapsed >= 0:", start.elapsed_time(end) >= 0)
torch.cuda.current_stream().wait_stream(s)

# A small MLP, 50 steps of SGD with a fixed seed.
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = step_losses(model, opt, (256, 64), 50)
say("mlp loss step 0:", f"{losses[0]:.4f}")
say("mlp loss step 49:", f"{losses[-1]:.4f}")
say("mlp loss went down:", losses[-1] < losses[0])

say("memory_allocated > 0:", torch.cuda.memory_allocated() > 0)
torch.cuda.synchronize()
say("basics: PASS")
sys.exit(0)
