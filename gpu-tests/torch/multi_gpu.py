"""One PyTorch process on every GPU it sees (run with gpu-tests/run.sh --gpus 0,1): the device
count and names, a seeded matmul on each device, copies between devices (cuda:0 -> cuda:1 and
back through the host), a small model's forward and backward on each, and single-process NCCL
(torch.cuda.nccl: an all-reduce over one tensor per device). On one GPU it says so."""
import torch


def say(*parts):
    print(*parts, flush=True)


count = torch.cuda.device_count()
say("devices:", count)
for d in range(count):
    say(f"device {d}:", torch.cuda.get_device_name(d))
if count < 2:
    say("one device: nothing between devices to test")
    raise SystemExit(0)

say("peer 0->1:", torch.cuda.can_device_access_peer(0, 1), "1->0:", torch.cuda.can_device_access_peer(1, 0))
cpu = torch.Generator().manual_seed(7)
a = torch.randn(1024, 1024, generator=cpu)
b = torch.randn(1024, 1024, generator=cpu)
for d in range(count):
    dev = torch.device("cuda", d)
    # fp32 without TF32, so the sums match run to run.
    torch.backends.cuda.matmul.allow_tf32 = False
    c = a.to(dev) @ b.to(dev)
    say(f"matmul on cuda:{d}: sum {c.double().sum().item():.6e}, on {c.device}")

x = torch.arange(1 << 22, dtype=torch.float32, device="cuda:0")
y = x.to("cuda:1")
say("cuda:0 -> cuda:1 equal:", bool(torch.equal(y.cpu(), x.cpu())), "on", y.device)
z = (y * 2).to("cuda:0")
say("cuda:1 -> cuda:0 doubled:", bool(torch.equal(z, x * 2)))

torch.manual_seed(3)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10))
for d in range(count):
    replica = torch.nn.Sequential(*[layer for layer in model]).to(f"cuda:{d}")
    inputs = torch.randn(64, 256, generator=cpu).to(f"cuda:{d}")
    loss = replica(inputs).square().mean()
    loss.backward()
    grad = replica[0].weight.grad.double().abs().sum().item()
    say(f"model on cuda:{d}: loss {loss.item():.6f}, grad norm1 {grad:.6e}")
    model.zero_grad()
    model.to("cpu")

tensors = [torch.full((1 << 20,), float(d + 1), device=f"cuda:{d}") for d in range(count)]
torch.cuda.nccl.all_reduce(tensors)
expected = float(sum(range(1, count + 1)))
say("nccl all_reduce (one process):", all(bool((t == expected).all()) for t in tensors))
