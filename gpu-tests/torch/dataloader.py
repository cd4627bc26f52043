"""A DataLoader with worker processes and pinned memory feeding the GPU through Flyt: the workers
are forked from a process whose CUDA session is open (they only build batches on the CPU), the
pin-memory thread copies each batch into pinned memory, and the batches go to the GPU with
non_blocking copies. Every batch's sum is checked on the GPU against the expected value."""
import sys

import torch
from torch.utils.data import DataLoader, Dataset


def say(*parts):
    print(*parts, flush=True)


class Numbers(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        return torch.full((256,), float(index))


torch.cuda.init()
weights = torch.ones(256, device="cuda")
loader = DataLoader(Numbers(), batch_size=128, num_workers=2, pin_memory=True)
batches, bad, total = 0, 0, 0.0
for number, batch in enumerate(loader):
    on_gpu = batch.to("cuda", non_blocking=True)
    sums = on_gpu @ weights
    first = number * 128
    expected = torch.arange(first, first + 128, device="cuda", dtype=torch.float32) * 256
    bad += int((sums != expected).sum())
    total += float(sums.sum())
    batches += 1
say("batches:", batches)
say("rows with a wrong sum:", bad)
say("total:", total)
ok = batches == 32 and bad == 0 and total == 256 * 4095 * 4096 / 2
say("dataloader:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
