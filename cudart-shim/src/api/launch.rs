//! Kernel launches: `<<<...>>>` (push/pop configuration, kept on the app thread), the CUDA 13
//! stubs (`__cudaGetKernel` + `__cudaLaunchKernel`) and explicit `cudaLaunchKernel` share one
//! path into the client core, which packs the arguments into one asynchronous message.

use std::cell::RefCell;
use std::ffi::{c_uint, c_void};

use flyt_client::launch::{Args, Config};
use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::Dim3;

use super::streams::stream_id;
use crate::client::client;
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

/// Resolves the stream and hands the launch to the client core (no round trip).
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
    // The stream first: a launch on a stream the app cannot use now (an unknown handle, a capture
    // Flyt refused) fails for that reason whatever the kernel.
    let stream = stream_id(client, stream, per_thread_default)?;
    let config = Config { grid: to_dim3(grid), block: to_dim3(block), shared_mem, stream, attributes: Vec::new() };
    // SAFETY: forwarded contract.
    unsafe { client.launch(function, config, Args::Pointers(args)) }
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
