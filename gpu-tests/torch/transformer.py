"""A transformer through Flyt: nn.TransformerEncoder (attention through PyTorch's SDPA kernels)
trained 30 steps with AdamW, then its inference in eval mode checked against the same model on
the CPU, and mixed precision (autocast bf16) forward and backward."""
import sys

import torch


def say(*parts):
    print(*parts, flush=True)


torch.manual_seed(0)
vocab, d_model = 500, 256
layer = torch.nn.TransformerEncoderLayer(d_model, 8, 1024, dropout=0.0, batch_first=True, norm_first=True)
model = torch.nn.Sequential(
    torch.nn.Embedding(vocab, d_model), torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), torch.nn.Linear(d_model, vocab)
).cuda()
tokens = torch.randint(0, vocab, (16, 64), device="cuda")
targets = (tokens + 1) % vocab
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
losses = []
for _ in range(30):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(tokens).reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
fell = losses[-1] < 0.5 * losses[0]
say("training loss fell by half:", fell)

model.eval()
with torch.no_grad():
    on_gpu = model(tokens[:2]).cpu()
    on_cpu = model.cpu()(tokens[:2].cpu())
matches = bool(torch.allclose(on_gpu, on_cpu, rtol=1e-2, atol=1e-2))
say("eval inference matches the CPU:", matches)

model.cuda().train()
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = torch.nn.functional.cross_entropy(model(tokens).reshape(-1, vocab), targets.reshape(-1))
loss.backward()
grads_finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
say("bf16 autocast gradients finite:", grads_finite)

ok = fell and matches and grads_finite
say("transformer:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
