"""PyTorch convolution through Flyt (cuDNN): conv2d forward and backward against the CPU, a
batch-norm + ReLU block, and a small CNN trained 30 steps."""
import sys

import torch

from helpers.training import step_losses


def say(*parts):
    print(*parts, flush=True)


def close(a, b, tol):
    return bool(torch.allclose(a.float().cpu(), b.float().cpu(), rtol=tol, atol=tol))


torch.manual_seed(0)
say("cudnn available:", torch.backends.cudnn.is_available())
x = torch.randn(4, 3, 32, 32)
conv = torch.nn.Conv2d(3, 8, 3, padding=1)
want = conv(x)
conv_gpu = torch.nn.Conv2d(3, 8, 3, padding=1).cuda()
conv_gpu.load_state_dict(conv.state_dict())
xg = x.cuda().requires_grad_(True)
got = conv_gpu(xg)
say("conv2d forward close:", close(got, want, 1e-3))
xc = x.clone().requires_grad_(True)
conv(xc).square().sum().backward()
got.square().sum().backward()
say("conv2d input grad close:", close(xg.grad, xc.grad, 1e-2))
say("conv2d weight grad close:", close(conv_gpu.weight.grad, conv.weight.grad, 1e-2))

torch.manual_seed(1)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
    torch.nn.Linear(32, 10),
).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
losses = step_losses(model, opt, (64, 3, 32, 32), 30)
say("cnn loss step 0:", f"{losses[0]:.3f}")
say("cnn loss went down:", losses[-1] < losses[0])
say("conv: PASS")
sys.exit(0)
