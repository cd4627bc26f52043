"""torchvision through Flyt: a ResNet-18 from its config (random weights) trained 5 steps on random
images with SGD (cuDNN convolutions and batch norm), eval inference checked against the CPU, and
torchvision's GPU ops (nms, roi_align). Prints facts native and Flyt runs must agree on."""
import sys

import torch
import torchvision

from helpers.torch_training import trained


def say(*parts):
    print(*parts, flush=True)


torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10).cuda()
images = torch.randn(16, 3, 64, 64, device="cuda")
labels = torch.randint(0, 10, (16,), device="cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
fell = trained(optimizer, 5, lambda: torch.nn.functional.cross_entropy(model(images), labels))
model.eval()
with torch.no_grad():
    on_gpu = model(images[:2]).cpu()
    on_cpu = model.cpu()(images[:2].cpu())
matches = bool(torch.allclose(on_gpu, on_cpu, rtol=1e-2, atol=1e-2))
say("eval inference matches the CPU:", matches)
boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], dtype=torch.float32, device="cuda")
scores = torch.tensor([0.9, 0.8, 0.7], device="cuda")
kept = torchvision.ops.nms(boxes, scores, 0.5).tolist()
say("nms keeps:", kept)
feature = torch.arange(64.0, device="cuda").reshape(1, 1, 8, 8)
pooled = torchvision.ops.roi_align(feature, [torch.tensor([[0.0, 0.0, 4.0, 4.0]], device="cuda")], output_size=2)
say("roi_align:", [round(v, 3) for v in pooled.flatten().tolist()])
ok = fell and matches and kept == [0, 2]
say("torchvision_resnet:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
