"""The smallest JAX program: one jitted function on the GPU, its result printed."""
import jax
import jax.numpy as jnp

print("devices:", jax.devices(), flush=True)
x = jnp.arange(8.0)
print("first array:", x, flush=True)
print("jit:", jax.jit(lambda v: v * 2 + 1)(x), flush=True)
print("jax_first_jit: PASS", flush=True)
