"""CuPy through Flyt: arrays, elementwise and reduction kernels CuPy compiles at run time (NVRTC),
a raw kernel, cuBLAS matmul, cuFFT, cuRAND, sorting, streams and events, pinned memory. Prints
facts and values native and Flyt runs must agree on."""
import numpy as np
import cupy as cp


def say(*parts):
    print(*parts, flush=True)


say("devices:", cp.cuda.runtime.getDeviceCount())
say("compute capability:", cp.cuda.Device(0).compute_capability)
x = cp.arange(1 << 20, dtype=cp.float32)
say("sum:", float(x.sum()), "max:", float(x.max()))
say("round trip exact:", bool(np.array_equal(cp.asnumpy(x), np.arange(1 << 20, dtype=np.float32))))
axpy = cp.ElementwiseKernel("float32 a, float32 x, float32 y", "float32 z", "z = a * x + y", "axpy")
say("elementwise kernel:", float(axpy(cp.float32(2), x, cp.ones_like(x))[12345]))
squares = cp.RawKernel(r'''
extern "C" __global__ void squares(const int* in, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * in[i];
}''', "squares")
a = cp.arange(1000, dtype=cp.int32)
b = cp.empty_like(a)
squares((4,), (256,), (a, b, cp.int32(1000)))
say("raw kernel:", int(b[999]), int(b.sum()))
m = cp.random.RandomState(seed=1).standard_normal((256, 256), dtype=cp.float32)
ref = cp.asnumpy(m).astype(np.float64) @ cp.asnumpy(m).astype(np.float64)
say("matmul close:", bool(np.allclose(cp.asnumpy(m @ m), ref, rtol=1e-3, atol=1e-3)))
sig = cp.random.RandomState(seed=2).standard_normal(4096, dtype=cp.float32)
say("fft close:", bool(np.allclose(cp.asnumpy(cp.abs(cp.fft.fft(sig))), np.abs(np.fft.fft(cp.asnumpy(sig))), rtol=1e-3, atol=1e-2)))
say("sort exact:", bool(np.array_equal(cp.asnumpy(cp.sort(sig)), np.sort(cp.asnumpy(sig)))))
say("random head:", [round(float(v), 5) for v in sig[:3]])
stream = cp.cuda.Stream(non_blocking=True)
with stream:
    y = x * 2
    done = stream.record()
done.synchronize()
say("stream work done:", float(y[7]))
pinned = cp.cuda.alloc_pinned_memory(4 << 20)
host = np.frombuffer(pinned, dtype=np.float32, count=1 << 20)
host[:] = 3.0
dev = cp.asarray(host)
say("pinned copy:", float(dev.sum()))
say("cupy_basics: PASS")
