"""A PyTorch training loop the framework scripts share: they differ only in the model and its loss."""


def trained(optimizer, steps, loss_of):
    """Runs `steps` optimizer steps on the loss `loss_of()` returns, prints whether the last step's
    loss is below the first's (the same native and through Flyt) and returns that."""
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    fell = losses[-1] < losses[0]
    print("training loss fell:", fell, flush=True)
    return fell
