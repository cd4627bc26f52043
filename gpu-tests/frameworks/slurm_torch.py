"""A small PyTorch job for gpu-tests/slurm-torch.sh: run natively, then as `srun --flyt-gpus=1`.

Deterministic (seeded, deterministic algorithms, no TF32): a seeded matmul's checksum and 20 SGD
steps of a small MLP, each loss printed in full; the device count and name. On stderr, the
libcuda files mapped into the process (the script checks the job's is Flyt's) and whether the
job sees the GPU's device files as devices.
"""

import os
import stat
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

device = torch.device("cuda")
print(f"devices {torch.cuda.device_count()}: {torch.cuda.get_device_name(0)}")
generator = torch.Generator().manual_seed(1)
a = torch.randn(512, 512, generator=generator).to(device)
b = torch.randn(512, 512, generator=generator).to(device)
print(f"matmul checksum {(a @ b).double().sum().item():.6f}")
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 256, generator=generator).to(device)
y = torch.randint(0, 10, (64,), generator=generator).to(device)
for step in range(20):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step:2d} loss {loss.item()!r}")
torch.cuda.synchronize()
print("done")
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libcuda.so" in line})
print(f"libcuda mapped: {' '.join(mapped)}", file=sys.stderr)
nodes = [f"/dev/{name}" for name in sorted(os.listdir("/dev")) if name.startswith("nvidia")]
devices = [node for node in nodes if stat.S_ISCHR(os.stat(node).st_mode) and os.major(os.stat(node).st_rdev) != 1]
print(f"GPU device nodes usable: {len(devices)}", file=sys.stderr)
