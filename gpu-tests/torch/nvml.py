# NVML as PyTorch and monitoring tools ask it (libnvidia-ml.so.1 through ctypes, the way pynvml
# does, and torch.cuda's own NVML helpers when pynvml is installed): the device count agrees with
# torch's, this process is listed with at least the memory its tensors hold, utilization is high
# while kernels keep the GPU busy and low after a second of idleness. Prints booleans, so native
# (the whole GPU) and Flyt (the tenant's slice) print the same.
import ctypes
import os
import sys
import time

import torch


class Process(ctypes.Structure):  # nvmlProcessInfo_t
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gpu_instance", ctypes.c_uint), ("compute_instance", ctypes.c_uint)]


class Utilization(ctypes.Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


nvml = ctypes.CDLL("libnvidia-ml.so.1")


results = []


def report(text, value):
    print(text, value)
    results.append(bool(value))


def check(name, *args):
    status = getattr(nvml, name)(*args)
    if status != 0:
        print(f"{name} returned {status}", file=sys.stderr)
    return status == 0


def utilization(handle):
    value = Utilization()
    check("nvmlDeviceGetUtilizationRates", handle, ctypes.byref(value))
    print(f"utilization: gpu {value.gpu}%, memory {value.memory}%", file=sys.stderr)
    return value


held = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
report("nvmlInit_v2:", check("nvmlInit_v2"))
count = ctypes.c_uint(0)
check("nvmlDeviceGetCount_v2", ctypes.byref(count))
report("NVML counts torch's devices:", count.value == torch.cuda.device_count())
handle = ctypes.c_void_p()
report("device 0 handle:", check("nvmlDeviceGetHandleByIndex_v2", 0, ctypes.byref(handle)))

processes = (Process * 64)()
listed = ctypes.c_uint(64)
check("nvmlDeviceGetComputeRunningProcesses_v3", handle, ctypes.byref(listed), processes)
mine = [p for p in processes[: listed.value] if p.pid == os.getpid()]
report("this process is listed once:", len(mine) == 1)
report("with at least its tensors' memory:", bool(mine) and mine[0].used >= held.numel())

# Busy: matrix products queued back to back for about 1.5 s, asked while the queue is still full.
a = torch.randn(4096, 4096, device="cuda")
started = time.monotonic()
while time.monotonic() - started < 1.5:
    for _ in range(20):
        b = a @ a
    torch.cuda.current_stream().synchronize()
for _ in range(200):
    b = a @ a
busy = utilization(handle)
report("utilization while kernels run is at least 50%:", busy.gpu >= 50)
torch.cuda.synchronize()
time.sleep(2.0)
idle = utilization(handle)
report("utilization after 2 s idle is at most 10%:", idle.gpu <= 10)

try:
    import pynvml  # noqa: F401  torch.cuda's helpers need it

    report("torch.cuda.list_gpu_processes names this process:", f"process {os.getpid():>10d}" in torch.cuda.list_gpu_processes())
    report("torch.cuda.device_memory_used counts the tensors:", torch.cuda.device_memory_used() >= held.numel())
except ImportError:
    print("pynvml is not installed: torch.cuda's NVML helpers not asked", file=sys.stderr)
check("nvmlShutdown")
print("nvml: PASS" if all(results) else "nvml: FAIL")
