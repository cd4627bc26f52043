"""PyTorch matmul through Flyt: fp32, fp16, bf16 and tf32 (cuBLAS, cuBLASLt) against the CPU in
fp64, batched matmul, and many small matmuls (the launch-bound shapes cuBLASLt serves with its own
kernel families)."""
import sys

import torch


def say(*parts):
    print(*parts, flush=True)


def close(a, b, tol):
    return bool(torch.allclose(a.float().cpu(), b.float().cpu(), rtol=tol, atol=tol))


torch.manual_seed(0)
a = torch.randn(256, 192)
b = torch.randn(192, 128)
want = (a.double() @ b.double()).float()
for dtype, tol in [(torch.float32, 1e-4), (torch.float16, 2e-2), (torch.bfloat16, 1e-1)]:
    got = a.to("cuda", dtype) @ b.to("cuda", dtype)
    say(f"matmul {dtype} close:", close(got, want, tol))
torch.backends.cuda.matmul.allow_tf32 = True
say("matmul tf32 close:", close(a.cuda() @ b.cuda(), want, 5e-2))
torch.backends.cuda.matmul.allow_tf32 = False
small = torch.randn(32, 32, device="cuda")
for _ in range(100):
    small = torch.tanh(small @ small)
say("100 small matmuls finite:", bool(torch.isfinite(small).all()))
bmm = torch.bmm(torch.randn(8, 64, 32, device="cuda"), torch.randn(8, 32, 16, device="cuda"))
say("bmm shape:", tuple(bmm.shape))

say("matmul: PASS")
sys.exit(0)
