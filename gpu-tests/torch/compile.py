"""torch.compile through Flyt: Inductor generates Triton kernels, which Triton compiles in the app's
process and loads and launches through the driver API (cuModuleLoadData, cuLaunchKernel) of
whichever libcuda.so.1 it finds (Flyt's: TRITON_LIBCUDA_PATH). A function, a module's inference
and a compiled training step, each checked against eager mode."""
import sys

import torch


def say(*parts):
    print(*parts, flush=True)


def close(a, b, tol):
    return bool(torch.allclose(a.float().cpu(), b.float().cpu(), rtol=tol, atol=tol))


torch.manual_seed(0)
ok = True


def f(x, y):
    return torch.sin(x) * y + torch.relu(y - x).sum(dim=-1, keepdim=True)


x = torch.randn(1024, 256, device="cuda")
y = torch.randn(1024, 256, device="cuda")
same = close(torch.compile(f)(x, y), f(x, y), 1e-4)
say("compiled function equals eager:", same)
ok &= same

model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10)).cuda()
compiled = torch.compile(model)
with torch.no_grad():
    same = close(compiled(x), model(x), 1e-3)
say("compiled module equals eager:", same)
ok &= same

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
targets = torch.randint(0, 10, (1024,), device="cuda")


@torch.compile
def train_step():
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), targets)
    loss.backward()
    return loss


losses = []
for _ in range(30):
    losses.append(float(train_step()))
    optimizer.step()
fell = losses[-1] < losses[0]
say("compiled training loss fell:", fell)
ok &= fell

say("compile:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
