"""The classifier training the PyTorch scripts share: they differ in the model, the optimizer, the
shape of the random batch and the number of steps."""
import torch


def step_losses(model, optimizer, batch_shape, steps):
    """Draws a random batch of `batch_shape` on the GPU and labels of 10 classes for it, runs `steps`
    optimizer steps of the cross entropy of model(batch) and returns each step's loss."""
    data = torch.randn(batch_shape, device="cuda")
    target = torch.randint(0, 10, (batch_shape[0],), device="cuda")
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
