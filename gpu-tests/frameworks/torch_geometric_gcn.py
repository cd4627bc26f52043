"""torch-geometric through Flyt: a two-layer GCN on a random graph (scatter and gather kernels,
sparse message passing) trained 20 steps, with its eval output checked against the CPU."""
import sys

import torch
from torch_geometric.nn import GCNConv

from helpers.torch_training import trained


def say(*parts):
    print(*parts, flush=True)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.one = GCNConv(16, 32)
        self.two = GCNConv(32, 4)

    def forward(self, x, edges):
        return self.two(torch.relu(self.one(x, edges)), edges)


torch.manual_seed(0)
nodes = 200
x = torch.randn(nodes, 16)
edges = torch.randint(0, nodes, (2, 1000))
labels = torch.randint(0, 4, (nodes,))
model = Net().cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
fell = trained(optimizer, 20, lambda: torch.nn.functional.cross_entropy(model(x.cuda(), edges.cuda()), labels.cuda()))
model.eval()
with torch.no_grad():
    on_gpu = model(x.cuda(), edges.cuda()).cpu()
    on_cpu = model.cpu()(x, edges)
matches = bool(torch.allclose(on_gpu, on_cpu, rtol=1e-3, atol=1e-3))
say("eval output matches the CPU:", matches)
ok = fell and matches
say("torch_geometric_gcn:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
