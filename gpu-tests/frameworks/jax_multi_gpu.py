"""JAX driving every GPU it sees from one process (run with gpu-tests/run.sh --gpus 0,1): device
discovery, a pmap'd computation with a cross-device psum (NCCL inside XLA), a sharded matmul over
a 1-D mesh, and a data-parallel training loop whose losses are printed in full (autotuning off,
deterministic ops). On one GPU it says so."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_gpu_autotune_level=0 --xla_gpu_deterministic_ops=true")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.3")

import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def say(*parts):
    print(*parts, flush=True)


devices = jax.devices()
say("devices:", len(devices), [d.platform for d in devices])
if len(devices) < 2:
    say("one device: nothing between devices to test")
    raise SystemExit(0)
n = len(devices)

# pmap with a psum across devices.
x = jnp.arange(n * 4, dtype=jnp.float32).reshape(n, 4)
summed = jax.pmap(lambda v: jax.lax.psum(v * 2.0, "i"), axis_name="i")(x)
say("pmap psum:", np.asarray(summed)[0].tolist())

# A matmul sharded over a mesh of every device.
mesh = Mesh(np.array(devices), ("d",))
a = jax.device_put(jnp.arange(n * 256 * 128, dtype=jnp.float32).reshape(n * 256, 128) / 1e4, NamedSharding(mesh, P("d", None)))
b = jax.device_put(jnp.ones((128, 64), jnp.float32) / 128, NamedSharding(mesh, P(None, None)))
c = jax.jit(lambda a, b: a @ b)(a, b)
say("sharded matmul:", c.shape, "shards", len(c.addressable_shards), f"sum {float(jnp.sum(c)):.6e}")

# Data-parallel training: parameters replicated, the batch split over the devices, gradients
# averaged with pmean.
key = jax.random.PRNGKey(0)
k1, k2, k3 = jax.random.split(key, 3)
params = {"w1": jax.random.normal(k1, (32, 64)) * 0.1, "w2": jax.random.normal(k2, (64, 1)) * 0.1}
data = jax.random.normal(k3, (n, 64, 32))
target = jnp.sum(data, axis=-1, keepdims=True) * 0.1


def loss_fn(p, xb, yb):
    return jnp.mean((jnp.tanh(xb @ p["w1"]) @ p["w2"] - yb) ** 2)


def step(p, xb, yb):
    loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
    grads = jax.lax.pmean(grads, "i")
    return jax.tree_util.tree_map(lambda w, g: w - 0.05 * g, p, grads), jax.lax.pmean(loss, "i")


pstep = jax.pmap(step, axis_name="i")
# Replicated: one copy per device, stacked along the axis pmap splits.
replicated = jax.tree_util.tree_map(lambda w: jnp.stack([w] * n), params)
losses = []
for _ in range(20):
    replicated, loss = pstep(replicated, data, target)
    losses.append(float(loss[0]))
say("data-parallel losses:", " ".join(f"{v:.8e}" for v in losses))
