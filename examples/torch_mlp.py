"""Trains a small MLP on the GPU with PyTorch: run it natively, or through Flyt with
`tools/local-cluster -- python examples/torch_mlp.py` (a local cluster) or
`flyt run -- python examples/torch_mlp.py` (a running one). The program is the same either way.

It learns to tell apart two noisy spirals, prints the loss as it goes and the accuracy at the end,
and exits with status 1 if it did not learn.
"""

import math

import torch


def spirals(n, generator):
    """Two interleaved spirals, n points each, with their labels."""
    t = torch.rand(n, generator=generator) * 3 * math.pi
    arm = torch.stack([t * torch.cos(t), t * torch.sin(t)], dim=1) / (3 * math.pi)
    points = torch.cat([arm, -arm]) + 0.02 * torch.randn(2 * n, 2, generator=generator)
    labels = torch.cat([torch.zeros(n), torch.ones(n)]).long()
    return points, labels


def main():
    if not torch.cuda.is_available():
        raise SystemExit("torch_mlp: no CUDA device (natively: no GPU; through Flyt: no server?)")
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}")
    generator = torch.Generator().manual_seed(0)
    points, labels = (x.to(device) for x in spirals(4096, generator))
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 2),
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(1, 1501):
        batch = torch.randint(0, len(points), (512,), device=device)
        loss = torch.nn.functional.cross_entropy(model(points[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 300 == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}")
    with torch.no_grad():
        accuracy = (model(points).argmax(1) == labels).float().mean().item()
    print(f"accuracy {accuracy:.3f}")
    if accuracy < 0.95:
        raise SystemExit("torch_mlp: the model did not learn the spirals")


if __name__ == "__main__":
    main()
