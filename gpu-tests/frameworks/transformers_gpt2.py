"""Hugging Face transformers through Flyt: a small GPT-2 from its config (random weights, nothing
downloaded) trained 10 steps in bf16 autocast, then greedy generation of 20 tokens. The generated
tokens are printed: greedy decoding of the same weights is the same on every run."""
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from helpers.torch_training import trained


def say(*parts):
    print(*parts, flush=True)


torch.manual_seed(0)
config = GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=1000, n_positions=256)
model = GPT2LMHeadModel(config).cuda()
tokens = torch.randint(0, 1000, (8, 128), device="cuda")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)


def autocast_loss():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return model(tokens, labels=tokens).loss


fell = trained(optimizer, 10, autocast_loss)
model.eval()
with torch.no_grad():
    generated = model.generate(tokens[:1, :8], max_new_tokens=20, do_sample=False, pad_token_id=0)
say("generated tokens:", len(generated[0]) - 8)
ok = fell and len(generated[0]) == 28
say("transformers_gpt2:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
