//! Kernel launches: `<<<...>>>` (push/pop configuration, kept on the app thread), the CUDA 13
//! stubs (`__cudaGetKernel` + `__cudaLaunchKernel`) and explicit `cudaLaunchKernel` share one
//! path: arguments are packed by the kernel's parameter layout into one asynchronous message.

use std::cell::RefCell;
use std::ffi::{c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{Dim3, req};

use super::post;
use super::streams::stream_id;
use crate::client::{Client, client};
use crate::ffi::{cudaKernel_t, cudaStream_t, dim3, write_out};
use crate::registry::{Function, function_by_handle, function_by_host, kernel_handle};

type CallConfiguration = (dim3, dim3, usize, cudaStream_t);

thread_local! {
    /// `<<<grid, block, shared, stream>>>` pushes here and the kernel's stub pops.
    static CONFIGURATIONS: RefCell<Vec<CallConfiguration>> = const { RefCell::new(Vec::new()) };
}

pub unsafe fn __cudaPushCallConfiguration(grid: dim3, block: dim3, shared_mem: usize, stream: cudaStream_t) -> c_uint {
    let pushed = CONFIGURATIONS.try_with(|stack| stack.borrow_mut().push((grid, block, shared_mem, stream)));
    c_uint::from(pushed.is_err())
}

pub unsafe fn __cudaPopCallConfiguration(grid: *mut dim3, block: *mut dim3, shared_mem: *mut usize, stream: *mut c_void) -> CudaResult<()> {
    let popped = CONFIGURATIONS.try_with(|stack| stack.borrow_mut().pop()).ok().flatten();
    let (g, b, s, st) = popped.ok_or(CudaError::MISSING_CONFIGURATION)?;
    // SAFETY: the stub passes pointers to its own locals of these types.
    unsafe {
        write_out(grid, g)?;
        write_out(block, b)?;
        write_out(shared_mem, s)?;
        write_out(stream.cast::<cudaStream_t>(), st)
    }
}

pub unsafe fn __cudaGetKernel(kernel: *mut cudaKernel_t, host_fun: *const c_void) -> CudaResult<()> {
    let handle = kernel_handle(host_fun as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
    // SAFETY: the stub passes a pointer to its static handle.
    unsafe { write_out(kernel, handle as cudaKernel_t) }
}

fn to_dim3(d: dim3) -> Dim3 {
    Dim3 { x: d.x, y: d.y, z: d.z }
}

/// Refuses configurations the device cannot run at the call, as CUDA does, instead of failing
/// later at a sync point. CUDA 13 reports them as `cudaErrorInvalidValue` (measured on the GPU
/// machine: 2048 threads per block, grid y 65536, an empty grid and 1 MiB of dynamic shared
/// memory all are).
fn check_configuration(client: &Client, grid: Dim3, block: Dim3, shared_mem: usize) -> CudaResult<()> {
    let prop = crate::props::launch_limits(client).ok_or(CudaError::INVALID_DEVICE)?;
    let limit = |value: i32| u32::try_from(value).unwrap_or(u32::MAX).max(1);
    let block_ok = block.x >= 1
        && block.y >= 1
        && block.z >= 1
        && block.x <= limit(prop.maxThreadsDim[0])
        && block.y <= limit(prop.maxThreadsDim[1])
        && block.z <= limit(prop.maxThreadsDim[2])
        && block.volume() <= u64::from(limit(prop.maxThreadsPerBlock));
    let grid_ok = grid.x >= 1
        && grid.y >= 1
        && grid.z >= 1
        && grid.x <= limit(prop.maxGridSize[0])
        && grid.y <= limit(prop.maxGridSize[1])
        && grid.z <= limit(prop.maxGridSize[2]);
    let shared_ok = shared_mem <= prop.sharedMemPerBlockOptin;
    if block_ok && grid_ok && shared_ok { Ok(()) } else { Err(CudaError::INVALID_VALUE) }
}

/// Packs the arguments and sends the launch; no round trip.
///
/// # Safety
/// `args` is the stub's argument array: for each kernel parameter, a pointer to a value of that
/// parameter's size.
unsafe fn launch(
    function: &Function,
    grid: dim3,
    block: dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: cudaStream_t,
    per_thread_default: bool,
) -> CudaResult<()> {
    let client = client()?;
    let (grid, block) = (to_dim3(grid), to_dim3(block));
    check_configuration(client, grid, block, shared_mem)?;
    // The stream first: a launch on a stream the app cannot use now (an unknown handle, a capture
    // Flyt refused) fails for that reason whatever the kernel.
    let stream = stream_id(client, stream, per_thread_default)?;
    let layout = client.layout(function).inspect_err(|error| {
        if client.info.emulated {
            crate::diagnostics::once(
                "emulated-launch",
                &format!("flyt: kernel {} cannot run: the server's emulated device has no GPU ({error:?})", function.name),
            );
        }
    })?;
    let mut packed = vec![0u8; layout.args_len];
    if !layout.params.is_empty() && args.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    for (index, param) in layout.params.iter().enumerate() {
        // SAFETY: per this function's contract, `args[index]` points at `param.size` readable
        // bytes; the layout came from the driver for this very kernel.
        let value = unsafe {
            let source = *args.add(index);
            if source.is_null() {
                return Err(CudaError::INVALID_VALUE);
            }
            std::slice::from_raw_parts(source.cast::<u8>(), param.size as usize)
        };
        let offset = param.offset as usize;
        packed[offset..offset + value.len()].copy_from_slice(value);
    }
    let shared_mem = u32::try_from(shared_mem).map_err(|_| CudaError::INVALID_VALUE)?;
    post(client, req::Launch { function: function.reference(), grid, block, shared_mem, stream, args: packed })
}

fn by_handle(kernel: cudaKernel_t) -> CudaResult<std::sync::Arc<Function>> {
    function_by_handle(kernel as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)
}

/// `cudaLaunchKernel` of something that is not a registered kernel: CUDA 13 answers
/// `cudaErrorInvalidDeviceFunction` for NULL and `cudaErrorInvalidResourceHandle` for any other
/// pointer (measured on the GPU machine).
fn by_host(func: *const c_void) -> CudaResult<std::sync::Arc<Function>> {
    if func.is_null() {
        return Err(CudaError::INVALID_DEVICE_FUNCTION);
    }
    function_by_host(func as usize).ok_or(CudaError::INVALID_RESOURCE_HANDLE)
}

/// The four launch entry points differ only in how they find the kernel and what the null
/// stream means.
macro_rules! launch_entry {
    ($name:ident, $kernel:ty, $find:ident, $per_thread_default:expr) => {
        pub unsafe fn $name(
            kernel: $kernel,
            grid: dim3,
            block: dim3,
            args: *mut *mut c_void,
            shared_mem: usize,
            stream: cudaStream_t,
        ) -> CudaResult<()> {
            // SAFETY: the stub's (or `cudaLaunchKernel`'s) contract, see `launch`.
            unsafe { launch(&*$find(kernel)?, grid, block, args, shared_mem, stream, $per_thread_default) }
        }
    };
}

launch_entry!(__cudaLaunchKernel, cudaKernel_t, by_handle, false);
launch_entry!(__cudaLaunchKernel_ptsz, cudaKernel_t, by_handle, true);
launch_entry!(cudaLaunchKernel, *const c_void, by_host, false);
launch_entry!(cudaLaunchKernel_ptsz, *const c_void, by_host, true);
