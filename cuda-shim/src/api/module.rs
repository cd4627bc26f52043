//! Modules, libraries and kernels: images loaded through the client core (sent to the server, which
//! loads them into the session's context), kernels and variables found by name, and launches.
//!
//! Handles are client-chosen values: a module (`CUmodule`) and the library it came from
//! (`CUlibrary`) are the same id; a kernel (`CUkernel`) and its function (`CUfunction`) are the same
//! handle, as the driver lets `cuLaunchKernel` take either. A library loaded lazily (the default,
//! `CUDA_MODULE_LOADING`) reaches the server when something of it is first used; a module is loaded
//! at the call, so a bad image fails there.

#![allow(clippy::too_many_arguments, reason = "the driver API's signatures")]

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex};

use flyt_client::client::Client;
use flyt_client::images::{self, Image};
use flyt_client::launch::{Args, Config};
use flyt_client::registry::{self, Function};
use flyt_protocol::ops::{Dim3, JitOption, LaunchAttribute, LinkOutcome, req};

use super::session::{client, driver_error, resolve_stream, run, session_client};
use crate::CUresult;
use crate::driver::driver;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{
    CUdevice, CUdeviceptr, CUfunc_cache, CUfunction, CUfunction_attribute, CUfunctionLoadingState, CUjit_option, CUkernel, CUlaunchConfig,
    CUlibrary, CUlibraryOption, CUmodule, CUmoduleLoadingMode, CUoccupancyB2DSize, CUsharedconfig, CUstream,
};

/// Module handles are this plus the client core's module id; function handles this plus its
/// function handle. Far apart, so one passed as the other is refused.
const MODULE_BASE: usize = 0x6d6f_0000_0000;
const FUNCTION_BASE: usize = 0x6675_0000_0000;

fn module_handle<T>(id: u32) -> *mut T {
    std::ptr::without_provenance_mut(MODULE_BASE + id as usize)
}

fn module_id<T>(handle: *mut T) -> DriverResult<u32> {
    let offset = (handle as usize).checked_sub(MODULE_BASE).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    u32::try_from(offset).map_err(|_| CUresult::CUDA_ERROR_INVALID_HANDLE)
}

pub(super) fn function_handle<T>(function: &Function) -> *mut T {
    std::ptr::without_provenance_mut(FUNCTION_BASE + function.handle)
}

/// The kernel behind a `CUfunction`/`CUkernel`, while its module is loaded.
pub(super) fn function<T>(handle: *mut T) -> DriverResult<Arc<Function>> {
    if handle.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    (handle as usize).checked_sub(FUNCTION_BASE).and_then(registry::function_by_handle).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

// -- loading --

/// Checks a module load's JIT options and answers them: empty logs, zero time. Options that
/// would change the generated code are refused, never silently dropped (the load carries none to
/// the server); `CU_JIT_LOG_VERBOSE` only asks for more log, of which there is none.
///
/// # Safety
/// As for [`super::link::Options::parse`].
unsafe fn answer_jit_options(options: *mut CUjit_option, values: *mut *mut c_void, count: c_uint) -> DriverResult {
    // SAFETY: forwarded contract.
    let parsed = unsafe { super::link::Options::parse(options, values, count, "Flyt") }?;
    if let Some(code_option) = parsed.forwarded.iter().find(|option| option.option != JitOption::LOG_VERBOSE) {
        return Err(super::link::refuse_option(code_option.option, "Flyt"));
    }
    parsed.report(&LinkOutcome::default());
    Ok(())
}

/// `CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE` (only `cuLibraryGetUnifiedFunction`, which
/// Flyt does not support, reads it) and `CU_LIBRARY_BINARY_IS_PRESERVED`.
const LIBRARY_HOST_UNIVERSAL_TABLE: CUlibraryOption = 0;
const LIBRARY_BINARY_IS_PRESERVED: CUlibraryOption = 1;

/// Whether the library options promise the image stays (then it is not copied). The values
/// array may be NULL: `CU_LIBRARY_BINARY_IS_PRESERVED` then says so by being there, which is how
/// cuBLASLt loads its kernels; with values, a NULL value takes the promise back.
///
/// # Safety
/// As for [`answer_jit_options`].
unsafe fn preserved(options: *mut CUlibraryOption, values: *mut *mut c_void, count: c_uint) -> DriverResult<bool> {
    if count == 0 {
        return Ok(false);
    }
    non_null([options.cast()])?;
    let mut preserved = false;
    for index in 0..count as usize {
        // SAFETY: `options` has `count` entries, and so has `values` when it is not NULL (the
        // caller's contract).
        let (option, value) = unsafe { (*options.add(index), if values.is_null() { None } else { Some(*values.add(index)) }) };
        match option {
            LIBRARY_HOST_UNIVERSAL_TABLE => {}
            LIBRARY_BINARY_IS_PRESERVED => preserved = value.is_none_or(|value| !value.is_null()),
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    Ok(preserved)
}

fn lazy_loading() -> bool {
    let mut mode: CUmoduleLoadingMode = 0;
    // SAFETY: a valid out-pointer.
    unsafe { cuModuleGetLoadingMode(&mut mode) };
    mode == LAZY_LOADING
}

/// Loads a module now, in the current context: the server's answer is awaited, so a bad image or
/// one without code for the GPU fails at this call.
fn load_module(module: *mut CUmodule, image: Option<Image>) -> DriverResult {
    non_null([module.cast()])?;
    let image = image.ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE)?;
    let client = client()?;
    let id = client.load_module(image, false).map_err(driver_error)?;
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(module, module_handle(id)) }
}

/// The image at `ptr`, copied (the app may free its buffer once the call returns).
///
/// # Safety
/// `ptr` is NULL or a module image, per the driver API.
unsafe fn image_at(ptr: *const c_void) -> Option<Image> {
    // SAFETY: forwarded contract.
    unsafe { images::image(ptr, false) }.map(|(image, _)| image)
}

fn image_from_file(name: *const c_char) -> DriverResult<Image> {
    images::image_from_file(app_path(name)?).map(|(image, _)| image).map_err(file_error)
}

/// A file name the app passed (files are read on the client, where the app named them).
pub(super) fn app_path<'a>(name: *const c_char) -> DriverResult<&'a std::path::Path> {
    non_null([name.cast()])?;
    // SAFETY: checked non-NULL; a NUL-terminated path per the driver API, valid for the call.
    let path = unsafe { CStr::from_ptr(name) };
    Ok(std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes())))
}

/// A file that could not be read, in the driver's terms.
pub(super) fn file_error(error: std::io::Error) -> CUresult {
    match error.kind() {
        std::io::ErrorKind::NotFound => CUresult::CUDA_ERROR_FILE_NOT_FOUND,
        _ => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}

pub unsafe fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) -> CUresult {
    run(|| {
        let image = image_from_file(fname)?;
        load_module(module, Some(image))
    })
}

pub unsafe fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    // SAFETY: the caller's image, per the driver API.
    run(|| load_module(module, unsafe { image_at(image) }))
}

pub unsafe fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    num_options: c_uint,
    options: *mut CUjit_option,
    option_values: *mut *mut c_void,
) -> CUresult {
    run(|| {
        // SAFETY: the caller's option arrays and image, per the driver API.
        unsafe { answer_jit_options(options, option_values, num_options) }?;
        // SAFETY: as above.
        load_module(module, unsafe { image_at(image) })
    })
}

pub unsafe fn cuModuleLoadFatBinary(module: *mut CUmodule, fat_cubin: *const c_void) -> CUresult {
    // SAFETY: the caller's fat binary, per the driver API.
    run(|| load_module(module, unsafe { image_at(fat_cubin) }))
}

pub unsafe fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    run(|| unload(module_id(hmod)?))
}

fn unload(id: u32) -> DriverResult {
    driver().session()?;
    match flyt_client::client::existing_client() {
        Some(client) => client.unload_module(id).map_err(driver_error),
        // No session yet: only lazily loaded modules exist, none of them sent.
        None => registry::unload(None, None, id).map_err(driver_error),
    }
}

/// Entry 1 of the CudartInterface export table: a module from a fat binary the runtime registered.
pub unsafe fn load_fat_binary(module: *mut CUmodule, fat_cubin: *const c_void) -> CUresult {
    // SAFETY: the runtime passes its registered `__fatBinC_Wrapper_t`.
    run(|| load_module(module, unsafe { image_at(fat_cubin) }))
}

/// Entry 6: as entry 1, with host symbol relocations, which Flyt cannot apply on the server.
pub unsafe fn load_fat_binary_with_relocations(
    module: *mut CUmodule,
    fat_cubin: *const c_void,
    symbol_names: *const *const c_char,
    symbol_addresses: *mut *mut c_void,
    count: c_uint,
) -> CUresult {
    if count != 0 || !symbol_names.is_null() || !symbol_addresses.is_null() {
        return crate::diagnostics::unsupported(
            "module loading with host relocations (CudartInterface ModuleLoadFatBinaryWithRelocations)",
        );
    }
    // SAFETY: forwarded contract.
    unsafe { load_fat_binary(module, fat_cubin) }
}

unsafe fn load_library(
    library: *mut CUlibrary,
    image: impl FnOnce(bool) -> DriverResult<Image>,
    jit_options: *mut CUjit_option,
    jit_option_values: *mut *mut c_void,
    num_jit_options: c_uint,
    library_options: *mut CUlibraryOption,
    library_option_values: *mut *mut c_void,
    num_library_options: c_uint,
) -> DriverResult {
    non_null([library.cast()])?;
    if crate::ffi::trace_errors() {
        // SAFETY: the caller's option arrays, per the driver API (read only when non-NULL).
        unsafe { trace_library_options(jit_options, num_jit_options, library_options, library_option_values, num_library_options) };
    }
    // SAFETY: the caller's option arrays, per the driver API.
    unsafe { answer_jit_options(jit_options, jit_option_values, num_jit_options) }?;
    // SAFETY: as above.
    let preserved = unsafe { preserved(library_options, library_option_values, num_library_options) }?;
    driver().session()?;
    let lazy = lazy_loading();
    let image = image(preserved)?;
    let id = if lazy {
        registry::load(None, image, true)
    } else {
        flyt_client::client::client().map_err(driver_error)?.load_module(image, false)
    };
    let id = id.map_err(driver_error)?;
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(library, module_handle(id)) }
}

/// `FLYT_TRACE=errors`: the options a library load came with, for finding why one failed.
///
/// # Safety
/// As for [`load_library`].
unsafe fn trace_library_options(
    jit_options: *mut CUjit_option,
    num_jit_options: c_uint,
    library_options: *mut CUlibraryOption,
    library_option_values: *mut *mut c_void,
    num_library_options: c_uint,
) {
    let read = |count: c_uint, array: *const u32| -> Vec<u32> {
        // SAFETY: the caller's array of `count` entries (read only when non-NULL).
        (0..count as usize).filter(|_| !array.is_null()).map(|index| unsafe { *array.add(index) }).collect()
    };
    let values: Vec<usize> = (0..num_library_options as usize)
        .filter(|_| !library_option_values.is_null())
        // SAFETY: as above.
        .map(|index| unsafe { *library_option_values.add(index) } as usize)
        .collect();
    eprintln!(
        "flyt trace: library load: {num_jit_options} JIT options {:?}, {num_library_options} library options {:?} = {values:x?}",
        read(num_jit_options, jit_options.cast()),
        read(num_library_options, library_options.cast())
    );
}

pub unsafe fn cuLibraryLoadData(
    library: *mut CUlibrary,
    code: *const c_void,
    jit_options: *mut CUjit_option,
    jit_options_values: *mut *mut c_void,
    num_jit_options: c_uint,
    library_options: *mut CUlibraryOption,
    library_option_values: *mut *mut c_void,
    num_library_options: c_uint,
) -> CUresult {
    // SAFETY: the caller's image (kept without a copy only when it promised to preserve it).
    let image = |preserved| unsafe { images::image(code, preserved) }.map(|(image, _)| image).ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE);
    run(|| {
        // SAFETY: the caller's arrays, per the driver API.
        unsafe {
            load_library(
                library,
                image,
                jit_options,
                jit_options_values,
                num_jit_options,
                library_options,
                library_option_values,
                num_library_options,
            )
        }
    })
}

pub unsafe fn cuLibraryLoadFromFile(
    library: *mut CUlibrary,
    file_name: *const c_char,
    jit_options: *mut CUjit_option,
    jit_options_values: *mut *mut c_void,
    num_jit_options: c_uint,
    library_options: *mut CUlibraryOption,
    library_option_values: *mut *mut c_void,
    num_library_options: c_uint,
) -> CUresult {
    run(|| {
        // SAFETY: the caller's arrays, per the driver API.
        unsafe {
            load_library(
                library,
                |_| image_from_file(file_name),
                jit_options,
                jit_options_values,
                num_jit_options,
                library_options,
                library_option_values,
                num_library_options,
            )
        }
    })
}

pub unsafe fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    run(|| unload(module_id(library)?))
}

pub unsafe fn cuLibraryGetModule(p_mod: *mut CUmodule, library: CUlibrary) -> CUresult {
    run(|| {
        let id = module_id(library)?;
        // The module of a library is the library, loaded in the session's one context.
        client()?;
        // SAFETY: the caller's out-pointer (NULL refused).
        unsafe { write_out(p_mod, module_handle(id)) }
    })
}

// -- kernels and variables by name --

fn name_of(name: *const c_char) -> DriverResult<String> {
    non_null([name.cast()])?;
    // SAFETY: checked non-NULL; a NUL-terminated name per the driver API.
    Ok(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
}

/// A kernel by name. Asked in a context (`cuModuleGetFunction`) or not (`cuLibraryGetKernel`): the
/// session is the same either way.
fn find_function<T>(out: *mut *mut T, id: u32, name: *const c_char, needs_context: bool) -> DriverResult {
    non_null([out.cast()])?;
    let name = name_of(name)?;
    let client = if needs_context { client()? } else { session_client()? };
    let found = client.function_by_name(id, &name);
    let function = found.inspect_err(|error| client.note_unrunnable(&name, *error)).map_err(|error| match error {
        // A kernel the module lacks: the driver's "named symbol not found".
        flyt_protocol::CudaError::INVALID_DEVICE_FUNCTION => CUresult::CUDA_ERROR_NOT_FOUND,
        other => driver_error(other),
    })?;
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(out, function_handle(&function)) }
}

pub unsafe fn cuModuleGetFunction(hfunc: *mut CUfunction, hmod: CUmodule, name: *const c_char) -> CUresult {
    run(|| find_function(hfunc, module_id(hmod)?, name, true))
}

pub unsafe fn cuLibraryGetKernel(p_kernel: *mut CUkernel, library: CUlibrary, name: *const c_char) -> CUresult {
    run(|| find_function(p_kernel, module_id(library)?, name, false))
}

pub unsafe fn cuKernelGetFunction(p_func: *mut CUfunction, kernel: CUkernel) -> CUresult {
    run(|| {
        let function = function(kernel)?;
        client()?;
        // SAFETY: the caller's out-pointer (NULL refused).
        unsafe { write_out(p_func, function_handle(&function)) }
    })
}

/// The names of a module's kernels, in the driver's order, with the session that knows them.
fn kernel_names(id: u32, needs_context: bool) -> DriverResult<(&'static Client, Arc<Vec<String>>)> {
    let client = if needs_context { client()? } else { session_client()? };
    let names = client.function_names(id).map_err(driver_error)?;
    Ok((client, names))
}

/// The first `limit` kernels of a module, each with its handle (found as by name).
fn kernels_of(id: u32, needs_context: bool, limit: usize) -> DriverResult<Vec<Arc<Function>>> {
    let (client, names) = kernel_names(id, needs_context)?;
    names.iter().take(limit).map(|name| client.function_by_name(id, name).map_err(driver_error)).collect()
}

/// The number of kernels: their names suffice, no lookups.
fn write_count(count: *mut c_uint, id: u32, needs_context: bool) -> DriverResult {
    non_null([count.cast()])?;
    let n = c_uint::try_from(kernel_names(id, needs_context)?.1.len()).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(count, n) }
}

/// Writes up to `room` handles (the caller's buffer size, as the driver takes it).
fn write_handles<T>(out: *mut *mut T, room: c_uint, id: u32, needs_context: bool) -> DriverResult {
    non_null([out.cast()])?;
    for (index, kernel) in kernels_of(id, needs_context, room as usize)?.iter().enumerate() {
        // SAFETY: `out` is non-NULL with room for `room` handles (the driver API's contract).
        unsafe { out.add(index).write(function_handle(kernel)) };
    }
    Ok(())
}

pub unsafe fn cuModuleGetFunctionCount(count: *mut c_uint, module: CUmodule) -> CUresult {
    run(|| write_count(count, module_id(module)?, true))
}

pub unsafe fn cuModuleEnumerateFunctions(functions: *mut CUfunction, num_functions: c_uint, module: CUmodule) -> CUresult {
    run(|| write_handles(functions, num_functions, module_id(module)?, true))
}

pub unsafe fn cuLibraryGetKernelCount(count: *mut c_uint, lib: CUlibrary) -> CUresult {
    run(|| write_count(count, module_id(lib)?, false))
}

pub unsafe fn cuLibraryEnumerateKernels(kernels: *mut CUkernel, num_kernels: c_uint, lib: CUlibrary) -> CUresult {
    run(|| write_handles(kernels, num_kernels, module_id(lib)?, false))
}

/// What the tools module iterator (cuFFT's way to its kernels) hands each kernel to: the
/// caller's opaque word, the `CUfunction` and its name. Returns the number of kernels visited.
pub(crate) type EachFunction = unsafe extern "C" fn(*mut c_void, CUfunction, *const c_char);

pub(crate) fn each_function(module: CUmodule, visit: EachFunction, opaque: *mut c_void) -> DriverResult<usize> {
    let kernels = kernels_of(module_id(module)?, true, usize::MAX)?;
    for kernel in &kernels {
        let mut name: *const c_char = std::ptr::null();
        write_name(&mut name, function_handle::<c_void>(kernel))?;
        // SAFETY: the library's callback with its own opaque word, a live kernel's handle and a
        // name kept for the life of the process.
        unsafe { visit(opaque, function_handle(kernel), name) };
    }
    Ok(kernels.len())
}

fn find_global(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    id: u32,
    name: *const c_char,
    client: &Client,
    managed_only: bool,
) -> DriverResult {
    let name = name_of(name)?;
    let (address, size, managed) = client.global_by_name(id, &name).map_err(|error| match error {
        flyt_protocol::CudaError::INVALID_SYMBOL => CUresult::CUDA_ERROR_NOT_FOUND,
        other => driver_error(other),
    })?;
    if managed_only && !managed {
        return Err(CUresult::CUDA_ERROR_NOT_FOUND);
    }
    if managed {
        client.mirror_variable(id, address, size).map_err(driver_error)?;
    }
    // Either out-pointer may be NULL: the caller wants only the other.
    if !dptr.is_null() {
        // SAFETY: non-NULL; the caller's out-pointer.
        unsafe { dptr.write(address) };
    }
    if !bytes.is_null() {
        // SAFETY: non-NULL; the caller's out-pointer.
        unsafe { bytes.write(size as usize) };
    }
    Ok(())
}

pub unsafe fn cuModuleGetGlobal_v2(dptr: *mut CUdeviceptr, bytes: *mut usize, hmod: CUmodule, name: *const c_char) -> CUresult {
    run(|| find_global(dptr, bytes, module_id(hmod)?, name, client()?, false))
}

pub unsafe fn cuLibraryGetGlobal(dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char) -> CUresult {
    run(|| find_global(dptr, bytes, module_id(library)?, name, client()?, false))
}

/// A `__managed__` variable: its address, which the app reaches through a mirror
/// (`flyt_client::mirrors`); a variable that is not managed is not found, as with the driver.
/// Managed memory belongs to no context: NVIDIA's runtime asks before it makes one.
pub unsafe fn cuLibraryGetManaged(dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: *const c_char) -> CUresult {
    run(|| find_global(dptr, bytes, module_id(library)?, name, session_client()?, true))
}

// -- what a kernel is --

/// Names handed out as `const char *`, kept for the life of the process.
static NAMES: Mutex<Option<HashMap<usize, &'static CStr>>> = Mutex::new(None);

fn write_name<T>(out: *mut *const c_char, handle: *mut T) -> DriverResult {
    non_null([out.cast()])?;
    let function = function(handle)?;
    let mut names = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let name = *names.get_or_insert_with(HashMap::new).entry(function.handle).or_insert_with(|| {
        let owned = CString::new(function.name.clone()).unwrap_or_default();
        Box::leak(owned.into_boxed_c_str())
    });
    // SAFETY: checked non-NULL; the caller's out-pointer.
    unsafe { write_out(out, name.as_ptr()) }
}

pub unsafe fn cuFuncGetName(name: *mut *const c_char, hfunc: CUfunction) -> CUresult {
    run(|| write_name(name, hfunc))
}

pub unsafe fn cuKernelGetName(name: *mut *const c_char, hfunc: CUkernel) -> CUresult {
    run(|| write_name(name, hfunc))
}

pub unsafe fn cuFuncGetModule(hmod: *mut CUmodule, hfunc: CUfunction) -> CUresult {
    run(|| {
        let function = function(hfunc)?;
        // SAFETY: the caller's out-pointer (NULL refused).
        unsafe { write_out(hmod, module_handle(function.module)) }
    })
}

pub unsafe fn cuKernelGetLibrary(p_lib: *mut CUlibrary, kernel: CUkernel) -> CUresult {
    run(|| {
        let function = function(kernel)?;
        // SAFETY: the caller's out-pointer (NULL refused).
        unsafe { write_out(p_lib, module_handle(function.module)) }
    })
}

fn param_info<T>(handle: *mut T, index: usize, offset: *mut usize, size: *mut usize) -> DriverResult {
    let function = function(handle)?;
    let param = function.layout.params.get(index).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    // Either out-pointer may be NULL: the caller wants only the other.
    if !offset.is_null() {
        // SAFETY: non-NULL; the caller's out-pointer.
        unsafe { offset.write(param.offset as usize) };
    }
    if !size.is_null() {
        // SAFETY: non-NULL; the caller's out-pointer.
        unsafe { size.write(param.size as usize) };
    }
    Ok(())
}

pub unsafe fn cuFuncGetParamInfo(func: CUfunction, param_index: usize, param_offset: *mut usize, param_size: *mut usize) -> CUresult {
    run(|| param_info(func, param_index, param_offset, param_size))
}

pub unsafe fn cuKernelGetParamInfo(kernel: CUkernel, param_index: usize, param_offset: *mut usize, param_size: *mut usize) -> CUresult {
    run(|| param_info(kernel, param_index, param_offset, param_size))
}

/// `CU_FUNCTION_LOADED`: a kernel Flyt found by name was loaded by the server to answer.
const FUNCTION_LOADED: CUfunctionLoadingState = 1;

pub unsafe fn cuFuncIsLoaded(state: *mut CUfunctionLoadingState, function_handle: CUfunction) -> CUresult {
    run(|| {
        function(function_handle)?;
        // SAFETY: the caller's out-pointer (NULL refused).
        unsafe { write_out(state, FUNCTION_LOADED) }
    })
}

pub unsafe fn cuFuncLoad(function_handle: CUfunction) -> CUresult {
    // Already loaded: the server loaded it to give its parameter layout.
    run(|| function(function_handle).map(|_| ()))
}

/// `CU_FUNC_ATTRIBUTE_*` 0 to 15, from the kernel's attributes.
fn attribute(function: &Function, attribute: CUfunction_attribute) -> DriverResult<c_int> {
    let a = session_client()?.function_attributes(function).map_err(driver_error)?;
    let size = |bytes: u64| c_int::try_from(bytes).unwrap_or(c_int::MAX);
    Ok(match attribute {
        0 => a.max_threads_per_block,
        1 => size(a.shared_size_bytes),
        2 => size(a.const_size_bytes),
        3 => size(a.local_size_bytes),
        4 => a.num_regs,
        5 => a.ptx_version,
        6 => a.binary_version,
        7 => a.cache_mode_ca,
        8 => a.max_dynamic_shared_size_bytes,
        9 => a.preferred_shmem_carveout,
        10 => a.cluster_dim_must_be_set,
        11 => a.required_cluster_width,
        12 => a.required_cluster_height,
        13 => a.required_cluster_depth,
        14 => a.non_portable_cluster_size_allowed,
        15 => a.cluster_scheduling_policy_preference,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    })
}

/// The settable attributes: `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` (8) to
/// `CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE` (15).
fn set_attribute(function: &Function, attribute: CUfunction_attribute, value: c_int) -> DriverResult {
    if !(8..=15).contains(&attribute) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    session_client()?.set_function_attribute(function, attribute, value).map_err(driver_error)
}

pub unsafe fn cuFuncGetAttribute(pi: *mut c_int, attrib: CUfunction_attribute, hfunc: CUfunction) -> CUresult {
    run(|| {
        non_null([pi.cast()])?;
        let value = attribute(&*function(hfunc)?, attrib)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(pi, value) }
    })
}

/// The session has one device: a kernel's attributes on any other are an invalid device.
fn check_device(dev: CUdevice) -> DriverResult {
    driver().session()?.device(dev).map(|_| ())
}

pub unsafe fn cuKernelGetAttribute(pi: *mut c_int, attrib: CUfunction_attribute, kernel: CUkernel, dev: CUdevice) -> CUresult {
    run(|| {
        non_null([pi.cast()])?;
        check_device(dev)?;
        let value = attribute(&*function(kernel)?, attrib)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(pi, value) }
    })
}

pub unsafe fn cuFuncSetAttribute(hfunc: CUfunction, attrib: CUfunction_attribute, value: c_int) -> CUresult {
    run(|| set_attribute(&*function(hfunc)?, attrib, value))
}

/// A kernel's cache preference, applied by the server's driver to its function.
fn set_cache_config(function: &Function, config: CUfunc_cache) -> DriverResult {
    session_client()?.call(req::FuncSetCacheConfig { function: function.reference(), config }).map(|_| ()).map_err(driver_error)
}

pub unsafe fn cuFuncSetCacheConfig(hfunc: CUfunction, config: CUfunc_cache) -> CUresult {
    run(|| set_cache_config(&*function(hfunc)?, config))
}

/// Without effect, as on every GPU since Maxwell (see `cuCtxSetSharedMemConfig`); the function
/// and the value are checked.
pub unsafe fn cuFuncSetSharedMemConfig(hfunc: CUfunction, config: CUsharedconfig) -> CUresult {
    run(|| {
        function(hfunc)?;
        if super::context::SHARED_MEM_CONFIGS.contains(&config) { Ok(()) } else { Err(CUresult::CUDA_ERROR_INVALID_VALUE) }
    })
}

/// CUDA 13's runtime asks this way (`cudaFuncSetCacheConfig` on a registered kernel).
pub unsafe fn cuKernelSetCacheConfig(kernel: CUkernel, config: CUfunc_cache, dev: CUdevice) -> CUresult {
    run(|| {
        check_device(dev)?;
        set_cache_config(&*function(kernel)?, config)
    })
}

pub unsafe fn cuKernelSetAttribute(attrib: CUfunction_attribute, val: c_int, kernel: CUkernel, dev: CUdevice) -> CUresult {
    run(|| {
        check_device(dev)?;
        set_attribute(&*function(kernel)?, attrib, val)
    })
}

// -- launches --

/// `CU_LAUNCH_PARAM_END`, `CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`.
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

/// The packed buffer an `extra` array names.
///
/// # Safety
/// `extra` is an array of `CU_LAUNCH_PARAM_*` keys each followed by its value, ending with
/// `CU_LAUNCH_PARAM_END`, per the driver API.
pub(super) unsafe fn extra_buffer<'a>(extra: *mut *mut c_void) -> DriverResult<&'a [u8]> {
    let (mut buffer, mut size) = (std::ptr::null::<u8>(), None);
    let mut index = 0;
    loop {
        // SAFETY: the array runs to its END key (the caller's contract).
        let key = unsafe { *extra.add(index) } as usize;
        match key {
            PARAM_END => break,
            // SAFETY: each key but END is followed by its value.
            PARAM_BUFFER_POINTER => buffer = unsafe { *extra.add(index + 1) }.cast::<u8>(),
            PARAM_BUFFER_SIZE => {
                // SAFETY: the value is a pointer to the buffer's size.
                let pointer = unsafe { *extra.add(index + 1) }.cast::<usize>();
                non_null([pointer.cast()])?;
                // SAFETY: checked non-NULL; the caller's size.
                size = Some(unsafe { pointer.read() });
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        index += 2;
    }
    match (buffer.is_null(), size) {
        // SAFETY: the caller's buffer of the size it gave.
        (false, Some(size)) => Ok(unsafe { std::slice::from_raw_parts(buffer, size) }),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// A launch from either entry point.
///
/// # Safety
/// `kernel_params` and `extra` as the driver API's `cuLaunchKernel` requires.
unsafe fn launch(
    handle: CUfunction,
    grid: Dim3,
    block: Dim3,
    shared_mem: c_uint,
    stream: CUstream,
    ptsz: bool,
    attributes: Vec<LaunchAttribute>,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> DriverResult {
    let function = function(handle)?;
    let client = client()?;
    let stream = resolve_stream(client, stream, ptsz)?;
    let args = match (kernel_params.is_null(), extra.is_null()) {
        (_, true) => Args::Pointers(kernel_params),
        // SAFETY: the caller's `extra` array.
        (true, false) => Args::Packed(unsafe { extra_buffer(extra) }?),
        (false, false) => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    let config = Config { grid, block, shared_mem: shared_mem as usize, stream, attributes };
    // SAFETY: forwarded contract.
    unsafe { client.launch(&function, config, args) }.map_err(driver_error)
}

/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE` set: a launch whose blocks may synchronize grid-wide.
fn cooperative() -> Vec<LaunchAttribute> {
    vec![LaunchAttribute { id: 2, value: [1, 0, 0, 0] }]
}

/// The launch entry points: the attributes each adds, and whether it takes an `extra` array.
macro_rules! launch_kernel {
    ($($(#[$doc:meta])* $name:ident => $ptsz:literal, $attributes:expr $(, $extra:ident)?;)*) => {$(
        $(#[$doc])*
        pub unsafe fn $name(
            f: CUfunction,
            grid_dim_x: c_uint,
            grid_dim_y: c_uint,
            grid_dim_z: c_uint,
            block_dim_x: c_uint,
            block_dim_y: c_uint,
            block_dim_z: c_uint,
            shared_mem_bytes: c_uint,
            h_stream: CUstream,
            kernel_params: *mut *mut c_void,
            $($extra: *mut *mut c_void,)?
        ) -> CUresult {
            let grid = Dim3 { x: grid_dim_x, y: grid_dim_y, z: grid_dim_z };
            let block = Dim3 { x: block_dim_x, y: block_dim_y, z: block_dim_z };
            let extra: *mut *mut c_void = launch_kernel!(@extra $($extra)?);
            // SAFETY: the caller's arguments, per the driver API.
            run(|| unsafe { launch(f, grid, block, shared_mem_bytes, h_stream, $ptsz, $attributes, kernel_params, extra) })
        }
    )*};
    (@extra $extra:ident) => { $extra };
    (@extra) => { std::ptr::null_mut() };
}

launch_kernel! {
    cuLaunchKernel => false, Vec::new(), extra;
    cuLaunchKernel_ptsz => true, Vec::new(), extra;
    /// A cooperative launch: a launch with the cooperative attribute. A grid too large to be
    /// resident at once is refused by the server's driver, reported at the next synchronizing
    /// call as the launch's other errors are.
    cuLaunchCooperativeKernel => false, cooperative();
    cuLaunchCooperativeKernel_ptsz => true, cooperative();
}

/// One `CUlaunchAttribute` as laid out in CUDA 13: the id, 4 bytes of padding, a 64-byte union.
#[repr(C)]
struct RawLaunchAttribute {
    id: c_uint,
    pad: [u8; 4],
    value: [u32; 16],
}

const _: () = assert!(size_of::<RawLaunchAttribute>() == 72);

/// The attributes of a launch configuration (`CU_LAUNCH_ATTRIBUTE_IGNORE` left out).
///
/// # Safety
/// `config` points at a `CUlaunchConfig` whose `attrs` has `numAttrs` entries.
unsafe fn attributes_of(config: &CUlaunchConfig) -> DriverResult<Vec<LaunchAttribute>> {
    if config.numAttrs == 0 {
        return Ok(Vec::new());
    }
    non_null([config.attrs.cast()])?;
    let raw = config.attrs.cast::<RawLaunchAttribute>();
    Ok((0..config.numAttrs as usize)
        // SAFETY: `attrs` has `numAttrs` entries of the CUDA 13 layout (the caller's contract).
        .map(|index| unsafe { &*raw.add(index) })
        .filter(|attribute| attribute.id != 0)
        .map(|attribute| LaunchAttribute {
            id: attribute.id,
            value: [attribute.value[0], attribute.value[1], attribute.value[2], attribute.value[3]],
        })
        .collect())
}

fn geometry(config: &CUlaunchConfig) -> (Dim3, Dim3) {
    (
        Dim3 { x: config.gridDimX, y: config.gridDimY, z: config.gridDimZ },
        Dim3 { x: config.blockDimX, y: config.blockDimY, z: config.blockDimZ },
    )
}

unsafe fn launch_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    ptsz: bool,
) -> DriverResult {
    non_null([config.cast()])?;
    // SAFETY: checked non-NULL; the caller's configuration.
    let config = unsafe { &*config };
    // SAFETY: as above.
    let attributes = unsafe { attributes_of(config) }?;
    let (grid, block) = geometry(config);
    // SAFETY: the caller's arguments, per the driver API.
    unsafe { launch(f, grid, block, config.sharedMemBytes, config.hStream, ptsz, attributes, kernel_params, extra) }
}

per_thread_twins! {
    cuLaunchKernelEx, cuLaunchKernelEx_ptsz
        (
            config: *const CUlaunchConfig,
            f: CUfunction,
            kernel_params: *mut *mut c_void,
            extra: *mut *mut c_void,
        )
        |per_thread| {
            // SAFETY: the caller's arguments, per the driver API.
            run(|| unsafe { launch_ex(config, f, kernel_params, extra, per_thread) })
        }
}

// -- occupancy --

/// `CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE` is the only flag.
const OCCUPANCY_FLAGS: c_uint = 0x1;

pub unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    num_blocks: *mut c_int,
    func: CUfunction,
    block_size: c_int,
    dynamic_s_mem_size: usize,
) -> CUresult {
    // SAFETY: same contract, default flags.
    unsafe { cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks, func, block_size, dynamic_s_mem_size, 0) }
}

pub unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    num_blocks: *mut c_int,
    func: CUfunction,
    block_size: c_int,
    dynamic_s_mem_size: usize,
    flags: c_uint,
) -> CUresult {
    run(|| {
        non_null([num_blocks.cast()])?;
        if flags & !OCCUPANCY_FLAGS != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let blocks = client()?.max_active_blocks(&*function(func)?, block_size, dynamic_s_mem_size, flags).map_err(driver_error)?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(num_blocks, blocks) }
    })
}

/// What both cluster queries send: the kernel, the configuration's geometry and shared memory,
/// and its attributes, each of which must be one the server's driver is given.
struct ClusterQuery {
    function: flyt_protocol::ops::FunctionRef,
    grid: Dim3,
    block: Dim3,
    shared_mem: u32,
    attributes: Vec<LaunchAttribute>,
}

/// # Safety
/// `config` is NULL or the caller's launch configuration, with `numAttrs` attributes.
unsafe fn cluster_query(func: CUfunction, config: *const CUlaunchConfig) -> DriverResult<ClusterQuery> {
    non_null([config.cast()])?;
    let function = function(func)?;
    // SAFETY: checked non-NULL; the caller's configuration.
    let config = unsafe { &*config };
    // SAFETY: as above.
    let attributes = unsafe { attributes_of(config) }?;
    if let Some(attribute) = attributes.iter().find(|a| !a.is_forwarded()) {
        crate::diagnostics::once(
            &format!("occupancy-attribute-{}", attribute.id),
            &format!("flyt: launch attribute {} is not supported through Flyt (returning CUDA_ERROR_NOT_SUPPORTED)", attribute.id),
        );
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let (grid, block) = geometry(config);
    Ok(ClusterQuery { function: function.reference(), grid, block, shared_mem: config.sharedMemBytes, attributes })
}

pub unsafe fn cuOccupancyMaxActiveClusters(num_clusters: *mut c_int, func: CUfunction, config: *const CUlaunchConfig) -> CUresult {
    run(|| {
        non_null([num_clusters.cast()])?;
        // SAFETY: the caller's configuration, per the driver API's contract.
        let ClusterQuery { function, grid, block, shared_mem, attributes } = unsafe { cluster_query(func, config) }?;
        let request = req::OccupancyMaxActiveClusters { function, grid, block, shared_mem, attributes };
        let clusters = client()?.call(request).map_err(driver_error)?.clusters;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(num_clusters, clusters) }
    })
}

pub unsafe fn cuOccupancyMaxPotentialClusterSize(cluster_size: *mut c_int, func: CUfunction, config: *const CUlaunchConfig) -> CUresult {
    run(|| {
        non_null([cluster_size.cast()])?;
        // SAFETY: the caller's configuration, per the driver API's contract.
        let ClusterQuery { function, grid, block, shared_mem, attributes } = unsafe { cluster_query(func, config) }?;
        let request = req::OccupancyMaxPotentialClusterSize { function, grid, block, shared_mem, attributes };
        let size = client()?.call(request).map_err(driver_error)?.cluster_size;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(cluster_size, size) }
    })
}

pub unsafe fn cuOccupancyAvailableDynamicSMemPerBlock(
    dynamic_smem_size: *mut usize,
    func: CUfunction,
    num_blocks: c_int,
    block_size: c_int,
) -> CUresult {
    run(|| {
        non_null([dynamic_smem_size.cast()])?;
        let function = function(func)?;
        let client = client()?;
        let request = req::OccupancyAvailableDynamicSmem { function: function.reference(), num_blocks, block_size };
        let bytes = client.call(request).map_err(driver_error)?.bytes;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(dynamic_smem_size, bytes as usize) }
    })
}

/// The block size with the highest occupancy, found as CUDA's runtime finds it
/// (`cudaOccupancyMaxPotentialBlockSizeVariableSMemWithFlags`): every multiple of the warp size up
/// to the limit, largest first, each asked of the server, stopping at full occupancy.
fn max_potential_block_size(
    min_grid_size: *mut c_int,
    block_size: *mut c_int,
    func: CUfunction,
    smem_for_block: CUoccupancyB2DSize,
    dynamic_smem: usize,
    block_size_limit: c_int,
    flags: c_uint,
) -> DriverResult {
    use flyt_protocol::device::attr;
    non_null([min_grid_size.cast(), block_size.cast()])?;
    if flags & !OCCUPANCY_FLAGS != 0 || block_size_limit < 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let function = function(func)?;
    let client = client()?;
    let device = client.device(0).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
    let device_attribute = |id| device.attribute(id).filter(|v| *v > 0).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE);
    let threads_per_sm = device_attribute(attr::MAX_THREADS_PER_MULTIPROCESSOR)?;
    let warp = device_attribute(attr::WARP_SIZE)?;
    let sm_count = device_attribute(attr::MULTIPROCESSOR_COUNT)?;
    let device_limit = device_attribute(attr::MAX_THREADS_PER_BLOCK)?;
    let function_limit = client.function_attributes(&function).map_err(driver_error)?.max_threads_per_block;
    let limit = if block_size_limit == 0 { device_limit } else { block_size_limit.min(device_limit) }.min(function_limit);
    let (mut best_block, mut best_blocks, mut best_threads) = (0, 0, 0);
    let mut aligned = (limit + warp - 1) / warp * warp;
    while aligned > 0 {
        let size = limit.min(aligned);
        let smem = match smem_for_block {
            Some(callback) => {
                // SAFETY: the caller's callback, called as the runtime calls it: with a block size.
                unsafe { callback(size) }
            }
            None => dynamic_smem,
        };
        let blocks = client.max_active_blocks(&function, size, smem, flags).map_err(driver_error)?;
        if size * blocks > best_threads {
            (best_block, best_blocks, best_threads) = (size, blocks, size * blocks);
        }
        if best_threads == threads_per_sm {
            break;
        }
        aligned -= warp;
    }
    // SAFETY: both checked non-NULL; the caller's out-pointers.
    unsafe {
        write_out(min_grid_size, best_blocks * sm_count)?;
        write_out(block_size, best_block)
    }
}

pub unsafe fn cuOccupancyMaxPotentialBlockSize(
    min_grid_size: *mut c_int,
    block_size: *mut c_int,
    func: CUfunction,
    block_size_to_dynamic_s_mem_size: CUoccupancyB2DSize,
    dynamic_s_mem_size: usize,
    block_size_limit: c_int,
) -> CUresult {
    run(|| {
        max_potential_block_size(min_grid_size, block_size, func, block_size_to_dynamic_s_mem_size, dynamic_s_mem_size, block_size_limit, 0)
    })
}

pub unsafe fn cuOccupancyMaxPotentialBlockSizeWithFlags(
    min_grid_size: *mut c_int,
    block_size: *mut c_int,
    func: CUfunction,
    block_size_to_dynamic_s_mem_size: CUoccupancyB2DSize,
    dynamic_s_mem_size: usize,
    block_size_limit: c_int,
    flags: c_uint,
) -> CUresult {
    run(|| {
        max_potential_block_size(
            min_grid_size,
            block_size,
            func,
            block_size_to_dynamic_s_mem_size,
            dynamic_s_mem_size,
            block_size_limit,
            flags,
        )
    })
}

// -- loading mode --

/// `CU_MODULE_EAGER_LOADING` and `CU_MODULE_LAZY_LOADING`.
const EAGER_LOADING: CUmoduleLoadingMode = 1;
const LAZY_LOADING: CUmoduleLoadingMode = 2;

/// The loading mode the process asked for with `CUDA_MODULE_LOADING` (lazy unless `EAGER`, as the
/// driver's default is since CUDA 12.2). Answered in the process.
pub unsafe fn cuModuleGetLoadingMode(mode: *mut CUmoduleLoadingMode) -> CUresult {
    let value = match std::env::var("CUDA_MODULE_LOADING") {
        Ok(text) if text.eq_ignore_ascii_case("EAGER") => EAGER_LOADING,
        _ => LAZY_LOADING,
    };
    // SAFETY: the caller passes NULL (refused) or a writable mode.
    crate::ffi::finish(unsafe { crate::ffi::write_out(mode, value) })
}
