//! `cudaLibrary*`: libraries the app loads itself, over the driver's `cuLibrary*` (`cudaLibrary_t`
//! is the driver's `CUlibrary`). Their kernels become `cudaKernel_t`s of this runtime
//! (`registry::library_kernel`), which launch and answer queries as registered kernels do, also
//! where the runtime takes a kernel's host function (`cudaLaunchKernel((const void *)kernel, ...)`).
//! The runtime's JIT and library options are the driver's values.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use crate::driver::{CUkernel, CUlibrary, cu};
use crate::ffi::{cudaKernel_t, write_out};
use crate::registry;

/// The two loads, which differ only in where the code comes from.
macro_rules! library_load {
    ($($name:ident($source:ident: $source_ty:ty) => $driver:ident;)*) => {
        driver_forwards! {$(
            $name(
                library: *mut CUlibrary,
                $source: $source_ty,
                jit_options: *mut c_int,
                jit_values: *mut *mut c_void,
                jit_count: c_uint,
                library_options: *mut c_int,
                library_values: *mut *mut c_void,
                library_count: c_uint,
            ) => $driver(library, $source, jit_options.cast(), jit_values, jit_count, library_options.cast(), library_values, library_count);
        )*}
    };
}

library_load! {
    cudaLibraryLoadData(code: *const c_void) => cuLibraryLoadData;
    cudaLibraryLoadFromFile(file_name: *const c_char) => cuLibraryLoadFromFile;
}

pub unsafe fn cudaLibraryUnload(library: CUlibrary) -> CudaResult<()> {
    cu!(cuLibraryUnload(library))?;
    registry::forget_library(library as usize);
    Ok(())
}

pub unsafe fn cudaLibraryGetKernel(kernel: *mut cudaKernel_t, library: CUlibrary, name: *const c_char) -> CudaResult<()> {
    if kernel.is_null() || name.is_null() {
        return Err(CudaError::INVALID_VALUE);
    }
    // SAFETY: checked non-NULL; the app's NUL-terminated name.
    let handle = registry::library_kernel(library as usize, unsafe { CStr::from_ptr(name) })?;
    // SAFETY: checked non-NULL.
    unsafe { write_out(kernel, handle) }
}

pub unsafe fn cudaLibraryGetKernelCount(count: *mut c_uint, library: CUlibrary) -> CudaResult<()> {
    cu!(cuLibraryGetKernelCount(count, library))
}

pub unsafe fn cudaLibraryEnumerateKernels(kernels: *mut cudaKernel_t, num_kernels: c_uint, library: CUlibrary) -> CudaResult<()> {
    if kernels.is_null() || num_kernels == 0 {
        return Err(CudaError::INVALID_VALUE);
    }
    let mut found: Vec<CUkernel> = vec![std::ptr::null_mut(); num_kernels as usize];
    cu!(cuLibraryEnumerateKernels(found.as_mut_ptr(), num_kernels, library))?;
    for (index, driver_kernel) in found.into_iter().enumerate().filter(|(_, kernel)| !kernel.is_null()) {
        let mut name: *const c_char = std::ptr::null();
        cu!(cuKernelGetName(&mut name, driver_kernel))?;
        if name.is_null() {
            return Err(CudaError::UNKNOWN);
        }
        // SAFETY: the driver's NUL-terminated name of a kernel of this library.
        let handle = registry::library_kernel(library as usize, unsafe { CStr::from_ptr(name) })?;
        // SAFETY: the app's array of `num_kernels` handles.
        unsafe { kernels.add(index).write(handle) };
    }
    Ok(())
}

driver_forwards! {
    cudaLibraryGetGlobal(dev_ptr: *mut *mut c_void, bytes: *mut usize, library: CUlibrary, name: *const c_char) => cuLibraryGetGlobal(dev_ptr.cast(), bytes, library, name);
    cudaLibraryGetManaged(dev_ptr: *mut *mut c_void, bytes: *mut usize, library: CUlibrary, name: *const c_char) => cuLibraryGetManaged(dev_ptr.cast(), bytes, library, name);
}
