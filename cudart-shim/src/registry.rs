//! What nvcc's generated code registers, mostly from static constructors before `main`: fat
//! binaries, their kernels (by host stub) and their `__device__`/`__constant__` variables (by host
//! shadow). Registration records only. A fat binary becomes a driver library at the first use of
//! one of its kernels or variables (`cuLibraryLoadData`, which Flyt's driver loads lazily: the image
//! travels with that first lookup, in one round trip); each kernel and variable is looked up once.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, RwLock};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

use crate::driver::{CUdeviceptr, CUkernel, CUlibrary, cu, cu_ctx};

/// `CU_LIBRARY_BINARY_IS_PRESERVED`: the fat binary lives in the app's image for the life of the
/// process, so the driver need not copy it.
const LIBRARY_BINARY_IS_PRESERVED: c_int = 1;

/// A registered fat binary: nvcc's `__fatBinC_Wrapper_t`, and the library once loaded.
struct FatBinary {
    wrapper: usize,
    library: OnceLock<CudaResult<usize>>,
}

impl FatBinary {
    /// The driver library of this fat binary, loaded on first use.
    fn library(&self) -> CudaResult<CUlibrary> {
        let loaded = self.library.get_or_init(|| {
            let mut library: CUlibrary = std::ptr::null_mut();
            let mut options = [LIBRARY_BINARY_IS_PRESERVED];
            // The option's value is the flag itself (1, "preserved"), passed in the pointer slot.
            let mut values = [std::ptr::without_provenance_mut::<c_void>(1)];
            cu_ctx!(cuLibraryLoadData(
                &mut library,
                self.wrapper as *const c_void,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                (options.as_mut_ptr()).cast(),
                values.as_mut_ptr(),
                1,
            ))
            .map(|()| library as usize)
        });
        loaded.map(|library| library as CUlibrary)
    }
}

/// Where a kernel comes from: a registered fat binary (by index), or a library the app loaded
/// (`cudaLibraryLoadData`; the driver's `CUlibrary`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    FatBinary(usize),
    Library(usize),
}

/// A registered kernel: its source and name, and its driver handle once looked up.
pub struct Kernel {
    source: Source,
    name: CString,
    handle: OnceLock<CudaResult<usize>>,
}

/// A registered variable: its fat binary, name and size, and its device address once looked up.
pub struct Variable {
    fat_binary: usize,
    name: CString,
    pub size: usize,
    /// With the reset generation it was found in: a device reset loads the module anew, and its
    /// variables may move.
    address: Mutex<Option<(u64, CudaResult<CUdeviceptr>)>>,
}

/// A registered `__managed__` variable: its fat binary, name, and the slot where nvcc's host code
/// keeps the variable's pointer (filled by `__cudaInitModule`).
struct ManagedVariable {
    fat_binary: usize,
    pointer_slot: usize,
    name: CString,
}

#[derive(Default)]
struct Registry {
    fat_binaries: Vec<Arc<FatBinary>>,
    managed: Vec<ManagedVariable>,
    kernels: HashMap<usize, Arc<Kernel>>,
    /// The `cudaKernel_t` handles given out: each kernel's address, kept alive by `kernels`.
    handles: HashMap<usize, Arc<Kernel>>,
    variables: HashMap<usize, Arc<Variable>>,
}

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(|| RwLock::new(Registry::default()));

fn read() -> std::sync::RwLockReadGuard<'static, Registry> {
    REGISTRY.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The host function (the app's stub) whose kernel has the driver handle `handle`.
pub fn host_function_of(handle: CUkernel) -> Option<usize> {
    read().kernels.iter().find(|(_, kernel)| kernel.handle.get().is_some_and(|found| *found == Ok(handle as usize))).map(|(host, _)| *host)
}

fn write() -> std::sync::RwLockWriteGuard<'static, Registry> {
    REGISTRY.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// nvcc's wrapper magic (`__fatBinC_Wrapper_t.magic`), and the fat binary's own.
const WRAPPER_MAGIC: u32 = 0x466243b1;

/// Records a fat binary; its handle is the index + 1 in a leaked box (the app only passes it back).
///
/// # Safety
/// `wrapper` is NULL or the pointer nvcc's generated code passes to `__cudaRegisterFatBinary`.
pub unsafe fn add_fat_binary(wrapper: *const c_void) -> Option<*mut *mut c_void> {
    if wrapper.is_null() {
        return None;
    }
    // SAFETY: nvcc's wrapper starts with its 4-byte magic.
    let magic = unsafe { wrapper.cast::<u32>().read_unaligned() };
    if magic != WRAPPER_MAGIC {
        return None;
    }
    let mut registry = write();
    registry.fat_binaries.push(Arc::new(FatBinary { wrapper: wrapper as usize, library: OnceLock::new() }));
    let id = registry.fat_binaries.len();
    Some(Box::into_raw(Box::new(id)).cast())
}

/// The fat binary index of a handle [`add_fat_binary`] gave out.
///
/// # Safety
/// `handle` is NULL or a handle `add_fat_binary` returned.
pub unsafe fn fat_binary_index(handle: *mut *mut c_void) -> Option<usize> {
    if handle.is_null() {
        return None;
    }
    // SAFETY: per the contract, a leaked `Box<usize>` from `add_fat_binary`.
    let id = unsafe { handle.cast::<usize>().read() };
    (1..=read().fat_binaries.len()).contains(&id).then(|| id - 1)
}

/// A NUL-terminated name in the app's image.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
pub unsafe fn c_name(name: *const c_char) -> Option<CString> {
    // SAFETY: per the contract.
    (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) }.to_owned())
}

pub fn add_kernel(fat_binary: usize, host_function: usize, name: CString) {
    let kernel = Arc::new(Kernel { source: Source::FatBinary(fat_binary), name, handle: OnceLock::new() });
    let mut registry = write();
    registry.handles.insert(Arc::as_ptr(&kernel) as usize, kernel.clone());
    registry.kernels.insert(host_function, kernel);
}

/// The kernel `name` of a library the app loaded, as a `cudaKernel_t`: found through the driver
/// (an unknown name fails here, as the runtime's lookup does), and the same handle for the same
/// kernel every time. The handle also names the kernel wherever the runtime takes a kernel's host
/// function (`cudaLaunchKernel((const void *)kernel, ...)`).
pub fn library_kernel(library: usize, name: &CStr) -> CudaResult<*mut c_void> {
    let source = Source::Library(library);
    if let Some(found) = read().handles.values().find(|kernel| kernel.source == source && kernel.name.as_c_str() == name) {
        return Ok(found.runtime_handle());
    }
    let mut driver_kernel: CUkernel = std::ptr::null_mut();
    cu!(cuLibraryGetKernel(&mut driver_kernel, library as CUlibrary, name.as_ptr()))?;
    let kernel = Arc::new(Kernel { source, name: name.to_owned(), handle: OnceLock::from(Ok(driver_kernel as usize)) });
    let handle = kernel.runtime_handle();
    let mut registry = write();
    registry.handles.insert(handle as usize, kernel.clone());
    registry.kernels.insert(handle as usize, kernel);
    Ok(handle)
}

/// Forgets the kernels of a library the app unloaded.
pub fn forget_library(library: usize) {
    let source = Source::Library(library);
    let mut registry = write();
    registry.handles.retain(|_, kernel| kernel.source != source);
    registry.kernels.retain(|_, kernel| kernel.source != source);
}

pub fn add_variable(fat_binary: usize, host_variable: usize, name: CString, size: usize) {
    write().variables.insert(host_variable, Arc::new(Variable { fat_binary, name, size, address: Mutex::new(None) }));
}

/// Records a `__managed__` variable (`__cudaRegisterManagedVar`).
pub fn add_managed_variable(fat_binary: usize, pointer_slot: usize, name: CString) {
    write().managed.push(ManagedVariable { fat_binary, pointer_slot, name });
}

/// The runtime's module initialization, which nvcc's host code calls before it first touches a
/// `__managed__` variable: loads the fat binary and points each of its managed variables' slots
/// at the variable (an address the app's host code may use, `cuLibraryGetManaged`).
pub fn init_managed(index: usize) -> CudaResult<()> {
    let slots: Vec<(usize, CString)> = read()
        .managed
        .iter()
        .filter(|managed| managed.fat_binary == index)
        .map(|managed| (managed.pointer_slot, managed.name.clone()))
        .collect();
    if slots.is_empty() {
        return Ok(());
    }
    let library = fat_binary(index)?.library()?;
    for (slot, name) in slots {
        let (mut address, mut size): (CUdeviceptr, usize) = (0, 0);
        cu_ctx!(cuLibraryGetManaged(&mut address, &mut size, library, name.as_ptr()))?;
        // SAFETY: the slot nvcc's registration code passed (`(void **)&__host<var>`), a pointer
        // variable in the app's image.
        unsafe { (slot as *mut *mut c_void).write(address as usize as *mut c_void) };
    }
    Ok(())
}

fn fat_binary(index: usize) -> CudaResult<Arc<FatBinary>> {
    read().fat_binaries.get(index).cloned().ok_or(CudaError::INVALID_DEVICE_FUNCTION)
}

/// The kernel registered for a host stub.
pub fn kernel_by_host(host_function: usize) -> Option<Arc<Kernel>> {
    read().kernels.get(&host_function).cloned()
}

/// The kernel of a `cudaKernel_t` this runtime gave out.
pub fn kernel_by_handle(handle: usize) -> Option<Arc<Kernel>> {
    read().handles.get(&handle).cloned()
}

impl Kernel {
    /// The `cudaKernel_t` of this kernel: no round trip (the driver's handle is looked up at the
    /// first launch).
    pub fn runtime_handle(self: &Arc<Self>) -> *mut c_void {
        Arc::as_ptr(self).cast_mut().cast()
    }

    /// The driver's handle of the kernel (a `CUkernel`, which launches as a `CUfunction`), looked
    /// up once: the first lookup of a fat binary's kernels also loads it.
    pub fn handle(&self) -> CudaResult<CUkernel> {
        if let Some(found) = self.handle.get() {
            return found.map(|handle| handle as CUkernel);
        }
        let library = match self.source {
            Source::FatBinary(index) => fat_binary(index).and_then(|fat_binary| fat_binary.library()),
            Source::Library(library) => Ok(library as CUlibrary),
        };
        let found = library.and_then(|library| {
            let mut kernel: CUkernel = std::ptr::null_mut();
            cu!(cuLibraryGetKernel(&mut kernel, library, self.name.as_ptr())).map(|()| kernel as usize)
        });
        self.handle.get_or_init(|| found).map(|handle| handle as CUkernel)
    }
}

/// The variable registered for a host shadow.
pub fn variable_by_host(host_variable: usize) -> Option<Arc<Variable>> {
    read().variables.get(&host_variable).cloned()
}

impl Variable {
    /// The variable's device address, looked up once per device reset generation.
    pub fn address(&self) -> CudaResult<CUdeviceptr> {
        let generation = crate::driver::reset_generation();
        if let Some((found_in, address)) = *self.address.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
            && found_in == generation
        {
            return address;
        }
        let found = fat_binary(self.fat_binary).and_then(|fat_binary| {
            let library = fat_binary.library()?;
            let (mut address, mut size): (CUdeviceptr, usize) = (0, 0);
            cu!(cuLibraryGetGlobal(&mut address, &mut size, library, self.name.as_ptr())).map(|()| address)
        });
        // A variable the image lacks is an invalid symbol to the runtime.
        let found = found.map_err(|error| if error == CudaError::SYMBOL_NOT_FOUND { CudaError::INVALID_SYMBOL } else { error });
        *self.address.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((generation, found));
        found
    }
}

/// Unloads a fat binary's library at exit (`__cudaUnregisterFatBinary`), if it was ever loaded.
pub fn unload(index: usize) {
    let loaded = read().fat_binaries.get(index).and_then(|fat_binary| fat_binary.library.get().copied());
    if let Some(Ok(library)) = loaded {
        let _ = cu!(cuLibraryUnload(library as CUlibrary));
    }
}
