"""PyTorch through Flyt: a transformer's training step, batch-1 inference, and the time from the
start of the script (before `import torch`) to a first result from the GPU. Prints one JSON object
per line, like the C programs. Checks what it measures: the training loss must fall, and the GPU's
inference must match the same model run on the CPU.

    python torch_bench.py [--quick] [--infer-only]

--infer-only skips the training (the inference then runs an untrained model: same kernels, same
timing) for diagnostics that repeat the inference row many times.
"""

import time

STARTED = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402


def emit(bench, **fields):
    print(json.dumps({"bench": bench, **fields}), flush=True)


def main():
    quick = "--quick" in sys.argv
    first = torch.ones(4, device="cuda").sum().item()
    emit("torch_first_result", ms=(time.perf_counter() - STARTED) * 1e3, ok=first == 4.0)
    emit("meta", program="torch_bench", gpu=torch.cuda.get_device_name(0), torch=torch.__version__)

    torch.manual_seed(0)
    vocab, d_model, layers, batch, seq = 1000, 512, 6, 32, 128

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, d_model)
            layer = torch.nn.TransformerEncoderLayer(d_model, 8, 2048, dropout=0.0, batch_first=True, norm_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = torch.nn.Linear(d_model, vocab)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    model = Model().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, vocab, (batch, seq), device="cuda")
    # Something to learn: each token's successor.
    targets = (tokens + 1) % vocab

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(tokens).reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.item()

    if "--infer-only" in sys.argv:
        infer(model, vocab, seq, quick)
        return
    losses = [step() for _ in range(5)]
    times = []
    for _ in range(10 if quick else 30):
        t = time.perf_counter()
        losses.append(step())
        times.append((time.perf_counter() - t) * 1e3)
    # The loss must fall well below its start.
    if not losses[-1] < 0.8 * losses[0]:
        raise SystemExit(f"torch_bench: training did not learn (loss {losses[0]:.3f} -> {losses[-1]:.3f})")
    emit("torch_train_step", p50_ms=statistics.median(times), min_ms=min(times), steps=len(times),
         first_loss=losses[0], last_loss=losses[-1])

    infer(model, vocab, seq, quick)


def infer(model, vocab, seq, quick):
    model.eval()
    sample = torch.randint(0, vocab, (1, seq), device="cuda")
    times = []
    with torch.no_grad():
        for _ in range(10):
            model(sample).argmax(-1).cpu()
        cpu, usage = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(20 if quick else 100):
            t = time.perf_counter()
            model(sample).argmax(-1).cpu()
            times.append((time.perf_counter() - t) * 1e3)
        # What the process spent meanwhile (all its threads): tells a slow run that burned CPU from
        # one that waited or was preempted.
        cpu, after = (time.process_time() - cpu) * 1e3 / len(times), resource.getrusage(resource.RUSAGE_SELF)
        on_gpu = model(sample).cpu()
        on_cpu = model.cpu()(sample.cpu())
    if not torch.allclose(on_gpu, on_cpu, rtol=1e-2, atol=1e-2):
        worst = (on_gpu - on_cpu).abs().max().item()
        raise SystemExit(f"torch_bench: the GPU's inference differs from the CPU's (max difference {worst:g})")
    emit("torch_infer_b1", p50_ms=statistics.median(times), min_ms=min(times), n=len(times), cpu_ms_per_step=cpu,
         involuntary_switches=after.ru_nivcsw - usage.ru_nivcsw, voluntary_switches=after.ru_nvcsw - usage.ru_nvcsw,
         load_1min=os.getloadavg()[0])


if __name__ == "__main__":
    main()
