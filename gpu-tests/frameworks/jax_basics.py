"""JAX through Flyt: device discovery, jit, grad, bf16/fp32 matmuls (cuBLAS), a convolution
(cuDNN), linalg (cuSOLVER), FFT (cuFFT), sort, random numbers, buffer donation, async dispatch,
a while loop and repeated calls (XLA's command buffers: CUDA graphs, conditional nodes), and a
100-step MLP training loop. Prints facts and values native and Flyt runs must agree on: autotuning
is off and ops deterministic, so the losses are printed in full.
With an argument (none, preallocate-off, platform) it runs only the allocator check, in that mode."""
import os
import sys

mode = sys.argv[1] if len(sys.argv) > 1 else None
os.environ.setdefault("XLA_FLAGS", "--xla_gpu_autotune_level=0 --xla_gpu_deterministic_ops=true")
if mode == "preallocate-off":
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
elif mode == "platform":
    os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax


def say(*parts):
    print(*parts, flush=True)


def close(a, b, tol):
    return bool(np.allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=tol, atol=tol))


if mode is not None:
    # The allocator check: allocations of several sizes, freed and made again, values exact.
    xs = [jnp.arange(n, dtype=jnp.float32) for n in (1, 1000, 1 << 20, 1 << 24)]
    total = sum(float(x.sum()) for x in xs)
    del xs
    y = jnp.ones((4096, 4096), jnp.float32) @ jnp.ones((4096, 64), jnp.float32)
    say(f"allocator {mode}: sums {total:.6e}, matmul {float(y[0, 0])}")
    say("jax_basics: PASS")
    sys.exit(0)

devices = jax.devices()
say("backend:", jax.default_backend())
say("devices:", len(devices), [d.platform for d in devices])
say("device kind:", devices[0].device_kind)

# jit and grad.
f = jax.jit(lambda x: jnp.sin(x) * x**2 + 3.0)
x = jnp.linspace(-2.0, 2.0, 1001, dtype=jnp.float32)
say("jit close to numpy:", close(f(x), np.sin(np.asarray(x)) * np.asarray(x) ** 2 + 3.0, 1e-5))
g = jax.grad(lambda x: jnp.sum(jnp.tanh(x) ** 2))(x)
xn = np.asarray(x, dtype=np.float64)
say("grad close to the derivative:", close(g, 2 * np.tanh(xn) * (1 - np.tanh(xn) ** 2), 1e-5))

# Matmuls: fp32 and bf16.
key = jax.random.PRNGKey(0)
k1, k2, k3, k4 = jax.random.split(key, 4)
a = jax.random.normal(k1, (512, 256), jnp.float32)
b = jax.random.normal(k2, (256, 384), jnp.float32)
ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
say("fp32 matmul close:", close(jnp.matmul(a, b, precision=lax.Precision.HIGHEST), ref, 1e-3))
c = (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)).astype(jnp.float32)
say("bf16 matmul close:", close(c, ref, 0.5))
say("random normal head:", [round(float(v), 5) for v in a[0, :4]])

# A convolution (cuDNN), checked against a direct sum.
img = jax.random.normal(k3, (2, 3, 16, 16), jnp.float32)
ker = jax.random.normal(k4, (4, 3, 3, 3), jnp.float32)
conv = lax.conv_general_dilated(img, ker, (1, 1), "VALID", precision=lax.Precision.HIGHEST)
imgn, kern = np.asarray(img, np.float64), np.asarray(ker, np.float64)
direct = np.zeros((2, 4, 14, 14))
for i in range(3):
    for j in range(3):
        direct += np.einsum("nchw,oc->nohw", imgn[:, :, i : i + 14, j : j + 14], kern[:, :, i, j])
say("conv close to a direct sum:", close(conv, direct, 1e-3))

# Linear algebra (cuSOLVER).
m = np.asarray(jax.random.normal(k1, (64, 64), jnp.float32), np.float64)
spd = jnp.asarray(m @ m.T + 64 * np.eye(64), jnp.float32)
chol = jnp.linalg.cholesky(spd)
say("cholesky reconstructs:", close(chol @ chol.T, spd, 1e-2))
q, r = jnp.linalg.qr(jnp.asarray(m, jnp.float32))
say("qr reconstructs:", close(q @ r, m, 1e-3))
s = jnp.linalg.svd(jnp.asarray(m, jnp.float32), compute_uv=False)
say("svd singular values close:", close(s, np.linalg.svd(m, compute_uv=False), 1e-2))
w = jnp.linalg.eigh(spd)[0]
say("eigh eigenvalues close:", close(w, np.linalg.eigvalsh(np.asarray(spd, np.float64)), 1e-2))
rhs = jnp.ones((64,), jnp.float32)
say("solve close:", close(jnp.linalg.solve(spd, rhs), np.linalg.solve(np.asarray(spd, np.float64), np.ones(64)), 1e-3))

# FFT (cuFFT).
sig = jax.random.normal(k2, (4096,), jnp.float32)
say("fft close:", close(jnp.abs(jnp.fft.fft(sig)), np.abs(np.fft.fft(np.asarray(sig, np.float64))), 1e-2))
say("rfft/irfft round trip:", close(jnp.fft.irfft(jnp.fft.rfft(sig), n=4096), sig, 1e-4))

# Sort, argsort, top-k: exact.
vals = jax.random.normal(k3, (100000,), jnp.float32)
say("sort exact:", bool(np.array_equal(np.asarray(jnp.sort(vals)), np.sort(np.asarray(vals)))))
say("argsort exact:", bool(np.array_equal(np.asarray(jnp.argsort(vals, stable=True)), np.argsort(np.asarray(vals), kind="stable"))))
say("top 3:", [round(float(v), 5) for v in lax.top_k(vals, 3)[0]])

# Donation: the argument's buffer is reused for the result.
donate = jax.jit(lambda v: v * 2.0 + 1.0, donate_argnums=0)
buf = jnp.arange(1 << 20, dtype=jnp.float32)
out = donate(buf)
say("donated result right:", float(out[12345]) == 24691.0, "argument deleted:", buf.is_deleted())

# Async dispatch: many steps queued, one wait.
step = jax.jit(lambda v: v * 0.5 + 1.0)
v = jnp.zeros((1 << 16,), jnp.float32)
for _ in range(200):
    v = step(v)
v.block_until_ready()
say("200 async steps converge:", float(v[0]))

# A while loop and a scan (XLA turns loops into conditional command-buffer nodes) and repeated
# calls of one executable (command buffers replayed).
def collatz_steps(n):
    def body(state):
        n, steps = state
        return jnp.where(n % 2 == 0, n // 2, 3 * n + 1), steps + 1

    return lax.while_loop(lambda s: s[0] != 1, body, (n, 0))[1]

say("while loop (collatz 27):", int(jax.jit(collatz_steps)(jnp.int32(27))))
cum = jax.jit(lambda xs: lax.scan(lambda c, x: (c + x, c * x), 0.0, xs))(jnp.arange(1.0, 11.0))
say("scan:", float(cum[0]), [float(t) for t in cum[1][:4]])
fused = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=1) + jnp.exp(-x).mean())
y = jax.random.normal(k4, (256, 256), jnp.float32)
first = np.asarray(fused(y))
same = all(np.array_equal(np.asarray(fused(y)), first) for _ in range(20))
say("20 replays equal the first:", same)

# A 100-step MLP regression: losses printed in full (deterministic ops, no autotuning).
def init(key, sizes):
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (n_in, n_out), jnp.float32) / np.sqrt(n_in), jnp.zeros((n_out,), jnp.float32)))
    return params


def forward(params, x):
    for w, b in params[:-1]:
        x = jax.nn.gelu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def loss_fn(params, x, y):
    return jnp.mean((forward(params, x) - y) ** 2)


@jax.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads), loss


params = init(jax.random.PRNGKey(1), [32, 128, 128, 1])
xs = jax.random.normal(jax.random.PRNGKey(2), (1024, 32), jnp.float32)
ys = jnp.sin(xs[:, :1] * 2.0) + 0.1 * xs[:, 1:2]
losses = []
for i in range(100):
    params, loss = train_step(params, xs, ys)
    losses.append(loss)
losses = [float(l) for l in losses]
say("losses every 10 steps:", [repr(l) for l in losses[::10]])
say("final loss:", repr(losses[-1]), "decreased:", losses[-1] < losses[0])

# The allocator modes, each in a process of its own.
import subprocess

for variant in ("preallocate-off", "platform"):
    run = subprocess.run([sys.executable, __file__, variant], capture_output=True, text=True, timeout=100)
    lines = [l for l in run.stdout.splitlines() if l.startswith("allocator")]
    say(lines[0] if lines else f"allocator {variant}: failed (exit {run.returncode}): {run.stderr.strip().splitlines()[-1:]}")

say("jax_basics: PASS")
