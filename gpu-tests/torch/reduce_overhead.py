# torch.compile(mode="reduce-overhead"): inductor's kernels replayed through CUDA graphs (cudagraph
# trees: stream capture, instantiate, replay, and the graph pool of the caching allocator). A small
# MLP's forward and backward are compiled; its outputs and gradients over several steps are
# compared with the same model run eagerly. Prints booleans, so native and Flyt print the same.
import torch

torch.manual_seed(0)
device = "cuda"
model = torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)
).to(device)
eager = torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)
).to(device)
eager.load_state_dict(model.state_dict())
compiled = torch.compile(model, mode="reduce-overhead")

outputs_match, grads_match = True, True
for step in range(6):
    x = torch.randn(32, 64, device=device)
    target = torch.randint(0, 10, (32,), device=device)
    out = compiled(x)
    loss = torch.nn.functional.cross_entropy(out, target)
    loss.backward()
    ref = eager(x)
    ref_loss = torch.nn.functional.cross_entropy(ref, target)
    ref_loss.backward()
    outputs_match &= torch.allclose(out, ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(model.parameters(), eager.parameters()):
        grads_match &= torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    model.zero_grad(set_to_none=True)
    eager.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print("reduce-overhead outputs match eager:", bool(outputs_match))
print("reduce-overhead gradients match eager:", bool(grads_match))
