# PyTorch's caching allocator on CUDA's stream-ordered allocator
# (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync): tensors allocated and freed on two streams,
# values checked, memory statistics, and a small MLP trained for 20 steps. Prints booleans, so native
# and Flyt print the same.
import os
import sys

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"

import torch  # noqa: E402

torch.manual_seed(0)
print("allocator backend:", torch.cuda.get_allocator_backend())
side = torch.cuda.Stream()
ok = True
for size in [1 << 10, 1 << 20, 1 << 24, 1 << 26]:
    x = torch.arange(size, device="cuda", dtype=torch.float32)
    with torch.cuda.stream(side):
        side.wait_stream(torch.cuda.current_stream())
        y = x * 2 + 1
    torch.cuda.current_stream().wait_stream(side)
    last, total, want_total = y[-1].item(), y.sum().item(), (x.sum() * 2 + size).item()
    right = last == 2 * (size - 1) + 1 and total == want_total
    if not right:
        # The booleans above go to stdout (compared with the native run); the values, for a
        # failure's diagnosis, to stderr.
        print(f"size {size}: y[-1] = {last} (want {2 * (size - 1) + 1}), sum(y) = {total} (want {want_total})", file=sys.stderr)
    ok &= right
    del x, y
print("tensors on two streams computed right:", ok)
torch.cuda.synchronize()
print("memory allocated returns to zero:", torch.cuda.memory_allocated() == 0)

model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data, target = torch.randn(256, 32, device="cuda"), torch.randint(0, 4, (256,), device="cuda")
losses = []
for _ in range(20):
    loss = torch.nn.functional.cross_entropy(model(data), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
print("loss fell:", losses[-1] < losses[0])
print("malloc_async: PASS" if ok and losses[-1] < losses[0] else "malloc_async: FAIL")
