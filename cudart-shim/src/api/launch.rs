//! Kernel launches: `<<<...>>>` (push/pop configuration, kept on the app thread), the CUDA 13
//! stubs (`__cudaGetKernel` + `__cudaLaunchKernel`) and explicit `cudaLaunchKernel` share one
//! path into the driver's `cuLaunchKernel`, which checks the configuration and queues the launch
//! with no round trip.

use std::cell::RefCell;
use std::ffi::{c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use std::sync::Arc;

use flyt_protocol::device::attr;

use crate::driver::{CUlaunchConfig, cu, cu_ctx};
use crate::ffi::{cudaKernel_t, cudaStream_t, dim3, write_out};
use crate::registry::{Kernel, kernel_by_handle, kernel_by_host};

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
    let handle = kernel_by_host(host_fun as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?.runtime_handle();
    // SAFETY: the stub passes a pointer to its static handle.
    unsafe { write_out(kernel, handle) }
}

/// Why a launch of a kernel that could not be found fails, when the launch itself is invalid:
/// CUDA refuses a bad configuration or stream whatever the kernel (the driver checks both too,
/// once it has the kernel).
fn invalid_launch(grid: dim3, block: dim3, shared_mem: usize, stream: cudaStream_t) -> Option<CudaError> {
    let device = crate::driver::current_device();
    let limit = |id: u32| {
        let mut value = 0;
        let id = std::ffi::c_int::try_from(id).unwrap_or(0);
        cu!(cuDeviceGetAttribute(&mut value, id.cast_unsigned(), device))
            .map_or(u32::MAX, |()| u32::try_from(value).unwrap_or(u32::MAX).max(1))
    };
    let within = |d: dim3, max: [u32; 3]| d.x >= 1 && d.y >= 1 && d.z >= 1 && d.x <= max[0] && d.y <= max[1] && d.z <= max[2];
    let max_block = [limit(attr::MAX_BLOCK_DIM_X), limit(attr::MAX_BLOCK_DIM_Y), limit(attr::MAX_BLOCK_DIM_Z)];
    let max_grid = [limit(attr::MAX_GRID_DIM_X), limit(attr::MAX_GRID_DIM_Y), limit(attr::MAX_GRID_DIM_Z)];
    let threads = u64::from(block.x) * u64::from(block.y) * u64::from(block.z);
    let valid = within(block, max_block)
        && threads <= u64::from(limit(attr::MAX_THREADS_PER_BLOCK))
        && within(grid, max_grid)
        && shared_mem <= limit(attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) as usize;
    if !valid {
        return Some(CudaError::INVALID_VALUE);
    }
    (!super::streams::is_stream(stream)).then_some(CudaError::INVALID_RESOURCE_HANDLE)
}

/// Hands the launch to the driver; a cooperative launch's blocks may synchronize with each other.
///
/// # Safety
/// `args` is the stub's argument array: for each kernel parameter, a pointer to a value of that
/// parameter's size.
#[expect(clippy::too_many_arguments, reason = "a launch's parameters plus how it is made")]
unsafe fn launch(
    kernel: &Kernel,
    grid: dim3,
    block: dim3,
    args: *mut *mut c_void,
    shared_mem: usize,
    stream: cudaStream_t,
    per_thread_default: bool,
    cooperative: bool,
) -> CudaResult<()> {
    let kernel = kernel.handle().map_err(|error| invalid_launch(grid, block, shared_mem, stream).unwrap_or(error))?;
    let shared_mem = c_uint::try_from(shared_mem).map_err(|_| CudaError::INVALID_VALUE)?;
    let extra = std::ptr::null_mut();
    let (g, b) = (grid, block);
    match (cooperative, per_thread_default) {
        (false, true) => cu_ctx!(cuLaunchKernel_ptsz(kernel.cast(), g.x, g.y, g.z, b.x, b.y, b.z, shared_mem, stream.cast(), args, extra)),
        (false, false) => cu_ctx!(cuLaunchKernel(kernel.cast(), g.x, g.y, g.z, b.x, b.y, b.z, shared_mem, stream.cast(), args, extra)),
        (true, true) => {
            cu_ctx!(cuLaunchCooperativeKernel_ptsz(kernel.cast(), g.x, g.y, g.z, b.x, b.y, b.z, shared_mem, stream.cast(), args))
        }
        (true, false) => cu_ctx!(cuLaunchCooperativeKernel(kernel.cast(), g.x, g.y, g.z, b.x, b.y, b.z, shared_mem, stream.cast(), args)),
    }
}

fn by_handle(kernel: cudaKernel_t) -> CudaResult<Arc<Kernel>> {
    kernel_by_handle(kernel as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)
}

/// `cudaLaunchKernel` of something that is not a registered kernel: CUDA 13 answers
/// `cudaErrorInvalidDeviceFunction` for NULL and `cudaErrorInvalidResourceHandle` for any other
/// pointer (measured on the GPU machine).
fn by_host(func: *const c_void) -> CudaResult<Arc<Kernel>> {
    if func.is_null() {
        return Err(CudaError::INVALID_DEVICE_FUNCTION);
    }
    kernel_by_host(func as usize).ok_or(CudaError::INVALID_RESOURCE_HANDLE)
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
            unsafe { launch(&*$find(kernel)?, grid, block, args, shared_mem, stream, $per_thread_default, false) }
        }
    };
}

launch_entry!(__cudaLaunchKernel, cudaKernel_t, by_handle, false);
launch_entry!(__cudaLaunchKernel_ptsz, cudaKernel_t, by_handle, true);
launch_entry!(cudaLaunchKernel, *const c_void, by_host, false);
launch_entry!(cudaLaunchKernel_ptsz, *const c_void, by_host, true);

per_thread_twins! {
    cudaLaunchCooperativeKernel, cudaLaunchCooperativeKernel_ptsz
        (func: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared_mem: usize, stream: cudaStream_t)
        |per_thread| {
            // SAFETY: as for `launch`.
            unsafe { launch(&*by_host(func)?, grid, block, args, shared_mem, stream, per_thread, true) }
        }
}

/// `cudaLaunchConfig_t`.
#[repr(C)]
pub struct cudaLaunchConfig_t {
    grid: dim3,
    block: dim3,
    dynamic_smem: usize,
    stream: cudaStream_t,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

/// The driver's form of a launch configuration (their attributes share one layout).
pub(super) fn driver_config(config: &cudaLaunchConfig_t) -> CudaResult<CUlaunchConfig> {
    Ok(CUlaunchConfig {
        gridDimX: config.grid.x,
        gridDimY: config.grid.y,
        gridDimZ: config.grid.z,
        blockDimX: config.block.x,
        blockDimY: config.block.y,
        blockDimZ: config.block.z,
        sharedMemBytes: c_uint::try_from(config.dynamic_smem).map_err(|_| CudaError::INVALID_VALUE)?,
        hStream: config.stream.cast(),
        attrs: config.attrs.cast(),
        numAttrs: config.num_attrs,
    })
}

/// `cudaLaunchKernelExC`: a launch with attributes (cooperative, clusters, priority...), which
/// the driver checks and the server applies.
///
/// # Safety
/// `config` is a readable `cudaLaunchConfig_t` whose `attrs` has `num_attrs` entries; `args` as
/// for [`launch`].
unsafe fn launch_ex(
    config: *const cudaLaunchConfig_t,
    func: *const c_void,
    args: *mut *mut c_void,
    per_thread_default: bool,
) -> CudaResult<()> {
    if config.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's config.
    let config = unsafe { &*config };
    let found = by_host(func)?;
    let kernel =
        found.handle().map_err(|error| invalid_launch(config.grid, config.block, config.dynamic_smem, config.stream).unwrap_or(error))?;
    let driver = driver_config(config)?;
    let extra = std::ptr::null_mut();
    if per_thread_default {
        cu_ctx!(cuLaunchKernelEx_ptsz(&driver, kernel.cast(), args, extra))
    } else {
        cu_ctx!(cuLaunchKernelEx(&driver, kernel.cast(), args, extra))
    }
}

per_thread_twins! {
    cudaLaunchKernelExC, cudaLaunchKernelExC_ptsz (config: *const cudaLaunchConfig_t, func: *const c_void, args: *mut *mut c_void)
        |per_thread| {
            // SAFETY: forwarded contract.
            unsafe { launch_ex(config, func, args, per_thread) }
        }
}
