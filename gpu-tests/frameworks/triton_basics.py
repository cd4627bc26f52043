"""Triton through Flyt: a vector add and a fused softmax written in Triton, compiled at run time
(Triton builds its launcher against the driver in TRITON_LIBCUDA_PATH), checked against PyTorch."""
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(in_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)


torch.manual_seed(0)
n = 98432
x = torch.rand(n, device="cuda")
y = torch.rand(n, device="cuda")
out = torch.empty_like(x)
add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
print("add equals torch:", torch.equal(out, x + y), flush=True)
m = torch.randn(64, 781, device="cuda")
s = torch.empty_like(m)
softmax_kernel[(64,)](s, m, m.stride(0), 781, BLOCK=1024)
print("softmax close to torch:", torch.allclose(s, torch.softmax(m, dim=1), atol=1e-6), flush=True)
print("triton_basics: PASS", flush=True)
