"""CUDA graphs in PyTorch through Flyt: a whole training step (MLP forward, backward, SGD step)
captured with torch.cuda.CUDAGraph after a warm-up on a side stream, as PyTorch's documentation
shows, and replayed 20 times with new data copied into the static inputs, its losses compared with
the same 20 steps done eagerly on a copy of the model; torch.cuda.make_graphed_callables on a small
module (forward and gradients against eager); two graphs captured into one shared memory pool
(torch.cuda.graph_pool_handle), replayed in capture order."""
import copy
import sys

import torch


def say(*parts):
    print(*parts, flush=True)


def close(a, b, tol):
    return bool(torch.allclose(a.float().cpu(), b.float().cpu(), rtol=tol, atol=tol))


ok = True
torch.manual_seed(0)
gen = torch.Generator().manual_seed(1)

# 1. A training step captured whole.
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()
loss_fn = torch.nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
static_input = torch.randn(256, 64, generator=gen).cuda()
static_target = torch.randn(256, 10, generator=gen).cuda()

side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(static_input), static_target).backward()
        optimizer.step()
torch.cuda.current_stream().wait_stream(side)

# The eager reference starts from the same weights (capturing runs nothing).
eager_model = copy.deepcopy(model)
eager_optimizer = torch.optim.SGD(eager_model.parameters(), lr=0.1)

graph = torch.cuda.CUDAGraph()
optimizer.zero_grad(set_to_none=True)
with torch.cuda.graph(graph):
    static_loss = loss_fn(model(static_input), static_target)
    static_loss.backward()
    optimizer.step()

data = [(torch.randn(256, 64, generator=gen), torch.randn(256, 10, generator=gen)) for _ in range(20)]
graph_losses, eager_losses = [], []
for x, y in data:
    static_input.copy_(x)
    static_target.copy_(y)
    graph.replay()
    graph_losses.append(static_loss.item())
for x, y in data:
    eager_optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(eager_model(x.cuda()), y.cuda())
    loss.backward()
    eager_optimizer.step()
    eager_losses.append(loss.item())
diff = max(abs(g - e) / abs(e) for g, e in zip(graph_losses, eager_losses))
say("graph replays:", len(graph_losses))
say("replayed loss step 0:", f"{graph_losses[0]:.4f}")
say("replayed loss step 19:", f"{graph_losses[-1]:.4f}")
same = diff < 1e-5
say("replayed losses equal eager (max relative diff < 1e-5):", same)
ok &= same
same = all(close(p, q, 1e-5) for p, q in zip(model.parameters(), eager_model.parameters()))
say("weights after 20 replays equal eager:", same)
ok &= same

# 2. make_graphed_callables on a small module.
torch.manual_seed(2)
module = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).cuda()
sample = torch.randn(16, 32, device="cuda")
graphed = torch.cuda.make_graphed_callables(module, (sample,))
x = torch.randn(16, 32, generator=gen).cuda()
module.zero_grad(set_to_none=True)
eager_out = module(x)
eager_out.square().sum().backward()
eager_grads = [p.grad.clone() for p in module.parameters()]
module.zero_grad(set_to_none=True)
graphed_out = graphed(x)
graphed_out.square().sum().backward()
same = close(graphed_out, eager_out, 1e-5)
say("graphed callable forward equals eager:", same)
ok &= same
same = all(close(p.grad, g, 1e-5) for p, g in zip(module.parameters(), eager_grads))
say("graphed callable gradients equal eager:", same)
ok &= same

# 3. Two graphs sharing one memory pool, replayed in the order they were captured.
pool = torch.cuda.graph_pool_handle()
a = torch.zeros(1 << 16, device="cuda")
with torch.cuda.stream(side):
    side.wait_stream(torch.cuda.current_stream())
    _ = (a * 2 + 1) * 3 - a  # warm-up
torch.cuda.current_stream().wait_stream(side)
first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
with torch.cuda.graph(first, pool=pool):
    b = a * 2 + 1
with torch.cuda.graph(second, pool=pool):
    c = b * 3 - a
results = []
for k in range(3):
    values = torch.arange(1 << 16, dtype=torch.float32) % (97 + k)
    a.copy_(values)
    first.replay()
    second.replay()
    torch.cuda.synchronize()
    results.append(torch.equal(c.cpu(), (values * 2 + 1) * 3 - values))
say("shared-pool graphs, 3 rounds exact:", results)
ok &= all(results)

torch.cuda.synchronize()
say("cuda_graphs:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
