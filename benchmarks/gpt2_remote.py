"""GPT-2 small (Hugging Face, from its config with random weights, bf16) on the GPU: a training
step of batch 8 x 512 tokens (AdamW) and greedy decoding (a 32-token prompt, 64 new tokens, with
the KV cache). 3 warm-up steps then 10 timed ones (each synchronized); decoding once to warm up,
then DECODE_RUNS (7) timed runs. Prints one JSON object per line: step p50/p99 in ms, decode ms per token (p50
of the runs). Checks what it measures: the loss must be finite and fall over the steps.
--decode-only skips the training (for counting the driver calls one decoded token makes:
FLYT_STATS=1 through Flyt)."""
import json
import os
import statistics
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config()).to("cuda", dtype=torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
tokens = torch.randint(0, model.config.vocab_size, (8, 512), device="cuda")

losses, times = [], []
for i in range(0 if "--decode-only" in sys.argv else 13):
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = model(tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    if i >= 3:
        times.append(time.perf_counter() - start)
    losses.append(loss.item())
if times:
    assert all(map(lambda x: x == x and abs(x) != float("inf"), losses)), losses
    assert losses[-1] < losses[0], losses
    times.sort()
    print(json.dumps({"bench": "gpt2_train_step", "batch": "8x512", "p50_ms": round(statistics.median(times) * 1e3, 2),
                      "p99_ms": round(times[-1] * 1e3, 2), "first_loss": round(losses[0], 3), "last_loss": round(losses[-1], 3)}), flush=True)

model.eval()
prompt = torch.randint(0, model.config.vocab_size, (1, 32), device="cuda")
per_token = []
with torch.no_grad():
    # Decoding is bound by the CPU's Python and launch work, which drifts on a shared host by
    # 10-30% between runs: a warm-up, then DECODE_RUNS timed runs (median).
    for i in range(1 + int(os.environ.get("DECODE_RUNS", "7"))):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        assert out.shape[1] == 96, out.shape
        if i > 0:
            per_token.append((time.perf_counter() - start) / 64)
print(json.dumps({"bench": "gpt2_decode", "new_tokens": 64, "ms_per_token": round(statistics.median(per_token) * 1e3, 3)}), flush=True)
