"""torchaudio through Flyt: a spectrogram, mel spectrogram and MFCC of a synthetic tone computed on
the GPU (cuFFT) and checked against the same transforms on the CPU, and a resample."""
import math
import sys

import torch
import torchaudio


def say(*parts):
    print(*parts, flush=True)


rate = 16000
t = torch.arange(rate, dtype=torch.float32) / rate
wave = (torch.sin(2 * math.pi * 440 * t) + 0.5 * torch.sin(2 * math.pi * 1000 * t)).unsqueeze(0)
results = []
for name, transform in [
    ("spectrogram", torchaudio.transforms.Spectrogram(n_fft=512)),
    ("mel", torchaudio.transforms.MelSpectrogram(sample_rate=rate, n_fft=512, n_mels=64)),
    ("mfcc", torchaudio.transforms.MFCC(sample_rate=rate, n_mfcc=13, melkwargs={"n_fft": 512, "n_mels": 64})),
]:
    on_gpu = transform.cuda()(wave.cuda()).cpu()
    on_cpu = transform.cpu()(wave)
    close = bool(torch.allclose(on_gpu, on_cpu, rtol=1e-3, atol=1e-2))
    say(f"{name} matches the CPU:", close, tuple(on_gpu.shape))
    results.append(close)
resampled = torchaudio.functional.resample(wave.cuda(), rate, 8000)
say("resampled length:", resampled.shape[-1])
peak = int(torch.fft.rfft(wave.cuda()).abs().argmax().item())
say("strongest frequency bin:", peak)
ok = all(results) and resampled.shape[-1] == 8000 and peak == 440
say("torchaudio_features:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
