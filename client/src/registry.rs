//! What the app registered: fatbinaries (from its static constructors, before `main`), their
//! kernels and variables. Registration needs no server: a module is sent as one request (image
//! plus every kernel and variable name) once a session exists, and its reply (parameter layouts,
//! variable addresses) is collected the first time something needs it.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, RwLock};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{FunctionRef, ParamInfo, Request, decode_reply, rep, req};

use crate::conn::{Conn, ReplySlot};
use crate::ranges::DeviceRanges;

/// `__fatBinC_Wrapper_t`'s magic.
const WRAPPER_MAGIC: u32 = 0x466243b1;
/// A fatbinary's magic.
const FATBIN_MAGIC: u32 = 0xBA55ED50;

/// A fatbinary image inside the app's executable (its `.nv_fatbin` section lives as long as the
/// process).
#[derive(Clone, Copy)]
pub struct Image {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the image is read-only data of the app's executable image, mapped for the process's
// lifetime; sharing the pointer between threads only shares read access.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Image {
    pub fn bytes(&self) -> &'static [u8] {
        // SAFETY: `ptr..ptr+len` is the whole fatbinary, validated in `image_from_wrapper`, and
        // lives in the executable's mapped image for the rest of the process.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Reads the fatbinary a `__fatBinC_Wrapper_t` points at: its header says how long it is.
///
/// # Safety
/// `wrapper` is NULL or the pointer nvcc's generated code passes to `__cudaRegisterFatBinary`.
pub unsafe fn image_from_wrapper(wrapper: *const c_void) -> Option<Image> {
    if wrapper.is_null() {
        return None;
    }
    // SAFETY: `__fatBinC_Wrapper_t` is `{ int magic; int version; const unsigned long long *data;
    // void *filename_or_fatbins; }`, readable per this function's contract.
    let (magic, data) = unsafe {
        let words = wrapper.cast::<u32>();
        (words.read_unaligned(), wrapper.cast::<u8>().add(8).cast::<*const u8>().read_unaligned())
    };
    if magic != WRAPPER_MAGIC || data.is_null() {
        return None;
    }
    // SAFETY: `data` points at the fatbinary header: `u32 magic, u16 version, u16 header_size,
    // u64 fat_size`, followed by `fat_size` bytes of entries.
    let (fat_magic, header_size, fat_size) = unsafe {
        (data.cast::<u32>().read_unaligned(), data.add(6).cast::<u16>().read_unaligned(), data.add(8).cast::<u64>().read_unaligned())
    };
    if fat_magic != FATBIN_MAGIC {
        return None;
    }
    let len = usize::try_from(fat_size).ok()?.checked_add(usize::from(header_size))?;
    Some(Image { ptr: data, len })
}

/// What the server said about a module.
struct Loaded {
    functions: Vec<CudaResult<Arc<Layout>>>,
    variables: Vec<CudaResult<(u64, u64)>>,
}

/// A kernel's parameter layout, ready for packing.
#[derive(Debug)]
pub struct Layout {
    pub params: Vec<ParamInfo>,
    pub args_len: usize,
}

impl Layout {
    pub fn new(params: Vec<ParamInfo>) -> Self {
        let args_len = params.iter().map(|p| p.offset as usize + p.size as usize).max().unwrap_or(0);
        Self { params, args_len }
    }
}

enum Registration {
    /// Not sent yet (no session, or the module is still being registered).
    Unsent,
    Sent(Arc<ReplySlot>),
    Done(Result<Arc<Loaded>, CudaError>),
}

pub struct Module {
    pub id: u32,
    pub image: Image,
    pub functions: Vec<String>,
    pub variables: Vec<String>,
    /// `__cudaRegisterFatBinaryEnd` was called: the name lists are complete.
    pub complete: bool,
    registration: Arc<Mutex<Registration>>,
}

/// A registered kernel.
pub struct Function {
    pub module: u32,
    pub index: u32,
    pub name: String,
    layout: OnceLock<CudaResult<Arc<Layout>>>,
}

impl Function {
    pub fn reference(&self) -> FunctionRef {
        FunctionRef { module: self.module, index: self.index }
    }
}

/// A registered `__device__`/`__constant__` variable.
pub struct Variable {
    pub module: u32,
    pub index: u32,
    pub name: String,
    pub size: usize,
    address: OnceLock<CudaResult<u64>>,
}

#[derive(Default)]
pub struct Registry {
    pub modules: Vec<Module>,
    pub functions: Vec<Arc<Function>>,
    by_host_function: HashMap<usize, usize>,
    pub variables: Vec<Arc<Variable>>,
    by_host_variable: HashMap<usize, usize>,
}

pub static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(|| RwLock::new(Registry::default()));

fn read() -> std::sync::RwLockReadGuard<'static, Registry> {
    REGISTRY.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write() -> std::sync::RwLockWriteGuard<'static, Registry> {
    REGISTRY.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Module handles given to the app are ids + 1 stored in a leaked box (the app only passes the
/// handle back).
pub fn module_handle(id: u32) -> *mut *mut c_void {
    Box::into_raw(Box::new(id as usize + 1)).cast()
}

/// # Safety
/// `handle` is NULL or a value returned by `module_handle`.
pub unsafe fn module_id(handle: *mut *mut c_void) -> Option<u32> {
    if handle.is_null() {
        return None;
    }
    // SAFETY: handles point at the `usize` boxed in `module_handle`, never freed.
    let value = unsafe { handle.cast::<usize>().read() };
    u32::try_from(value.checked_sub(1)?).ok()
}

/// # Safety
/// `name` is NULL or a NUL-terminated string.
pub unsafe fn c_name(name: *const c_char) -> Option<String> {
    if name.is_null() {
        return None;
    }
    // SAFETY: per this function's contract.
    Some(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
}

pub fn add_module(image: Image) -> u32 {
    let mut registry = write();
    let id = u32::try_from(registry.modules.len()).unwrap_or(u32::MAX);
    registry.modules.push(Module {
        id,
        image,
        functions: Vec::new(),
        variables: Vec::new(),
        complete: false,
        registration: Arc::new(Mutex::new(Registration::Unsent)),
    });
    id
}

pub fn add_function(module: u32, host_function: usize, name: String) {
    let mut registry = write();
    let Some(entry) = registry.modules.get_mut(module as usize) else {
        return;
    };
    let index = u32::try_from(entry.functions.len()).unwrap_or(u32::MAX);
    entry.functions.push(name.clone());
    let function = Arc::new(Function { module, index, name, layout: OnceLock::new() });
    let slot = registry.functions.len();
    registry.functions.push(function);
    registry.by_host_function.insert(host_function, slot);
}

pub fn add_variable(module: u32, host_variable: usize, name: String, size: usize) {
    let mut registry = write();
    let Some(entry) = registry.modules.get_mut(module as usize) else {
        return;
    };
    let index = u32::try_from(entry.variables.len()).unwrap_or(u32::MAX);
    entry.variables.push(name.clone());
    let variable = Arc::new(Variable { module, index, name, size, address: OnceLock::new() });
    let slot = registry.variables.len();
    registry.variables.push(variable);
    registry.by_host_variable.insert(host_variable, slot);
}

pub fn complete_module(module: u32) {
    if let Some(entry) = write().modules.get_mut(module as usize) {
        entry.complete = true;
    }
}

/// The kernel handle `__cudaGetKernel` gives out for a host stub: its index + 1.
pub fn kernel_handle(host_function: usize) -> Option<usize> {
    read().by_host_function.get(&host_function).map(|slot| slot + 1)
}

pub fn function_by_handle(handle: usize) -> Option<Arc<Function>> {
    read().functions.get(handle.checked_sub(1)?).cloned()
}

pub fn function_by_host(host_function: usize) -> Option<Arc<Function>> {
    let registry = read();
    registry.by_host_function.get(&host_function).and_then(|slot| registry.functions.get(*slot)).cloned()
}

pub fn variable_by_host(host_variable: usize) -> Option<Arc<Variable>> {
    let registry = read();
    registry.by_host_variable.get(&host_variable).and_then(|slot| registry.variables.get(*slot)).cloned()
}

/// The request that registers a module with the server.
fn registration_request(module: &Module) -> Request {
    req::RegisterModule { module: module.id, functions: module.functions.clone(), variables: module.variables.clone() }.into()
}

/// Sends the registration of every complete module not sent yet (right after the session
/// opens, so the server loads them while the app gets going).
pub fn send_unsent(conn: &Arc<Conn>) {
    let registry = read();
    for module in registry.modules.iter().filter(|module| module.complete) {
        send_if_unsent(conn, module);
    }
}

fn send_if_unsent(conn: &Arc<Conn>, module: &Module) {
    let mut registration = module.registration.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if matches!(*registration, Registration::Unsent) {
        *registration = match conn.send_with_bulk(&registration_request(module), module.image.bytes(), Some(())) {
            Ok(Some(slot)) => Registration::Sent(slot),
            Ok(None) => Registration::Done(Err(CudaError::UNKNOWN)),
            Err(error) => Registration::Done(Err(error)),
        };
    }
}

/// Sends one module's registration now if a session exists (a module registered after start).
pub fn send_module(conn: &Arc<Conn>, id: u32) {
    let registry = read();
    if let Some(module) = registry.modules.get(id as usize) {
        send_if_unsent(conn, module);
    }
}

/// The server's answer for a module, waiting for it (and sending the registration) if needed.
/// The variables it reports are added to `ranges`.
fn loaded(conn: &Arc<Conn>, ranges: &DeviceRanges, module_id: u32) -> CudaResult<Arc<Loaded>> {
    let registration = {
        let registry = read();
        let module = registry.modules.get(module_id as usize).ok_or(CudaError::INVALID_DEVICE_FUNCTION)?;
        send_if_unsent(conn, module);
        module.registration.clone()
    };
    collect(conn, Some(ranges), &registration)
}

/// Whether the server may hold module `id`: its registration was sent and not refused. Only such
/// a module is unregistered there (telling the server to drop one it refused comes back as an
/// error at the app's next sync point). Never waits: an answer not in yet counts as held.
pub fn held_by_server(conn: &Conn, id: u32) -> bool {
    let registration = match read().modules.get(id as usize) {
        Some(module) => module.registration.clone(),
        None => return false,
    };
    let answered = match &*registration.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
        Registration::Unsent => return false,
        Registration::Sent(slot) => slot.is_done(),
        Registration::Done(outcome) => return outcome.is_ok(),
    };
    !answered || collect(conn, None, &registration).is_ok()
}

/// Collects a sent registration's reply (once) and returns the outcome; the variables of a loaded
/// module are added to `ranges` (given by every caller that has the session's ranges at hand).
fn collect(conn: &Conn, ranges: Option<&DeviceRanges>, registration: &Mutex<Registration>) -> CudaResult<Arc<Loaded>> {
    let mut registration = registration.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Registration::Sent(slot) = &*registration {
        let slot = slot.clone();
        let _ = conn.flush();
        let outcome = slot.wait().and_then(|message| {
            let reply = decode_reply::<rep::RegisterModule>(&message).map_err(|_| CudaError::UNKNOWN)?;
            let fields = reply.result?;
            let functions = fields.functions.into_iter().map(|f| f.map(|f| Arc::new(Layout::new(f.params)))).collect();
            let variables = fields.variables.into_iter().map(|v| v.map(|v| (v.address, v.size))).collect();
            Ok(Arc::new(Loaded { functions, variables }))
        });
        if let (Ok(loaded), Some(ranges)) = (&outcome, ranges) {
            ranges.add_variables(loaded.variables.iter().filter_map(|v| v.ok()));
        }
        *registration = Registration::Done(outcome);
    }
    match &*registration {
        Registration::Done(outcome) => outcome.clone(),
        _ => Err(CudaError::UNKNOWN),
    }
}

impl Function {
    /// The kernel's parameter layout from the driver (one round trip per module, on first use).
    pub fn layout(&self, conn: &Arc<Conn>, ranges: &DeviceRanges) -> CudaResult<Arc<Layout>> {
        if let Some(layout) = self.layout.get() {
            return layout.clone();
        }
        let layout = loaded(conn, ranges, self.module)
            .and_then(|loaded| loaded.functions.get(self.index as usize).cloned().unwrap_or(Err(CudaError::INVALID_DEVICE_FUNCTION)));
        self.layout.get_or_init(|| layout).clone()
    }
}

impl Variable {
    /// The variable's device address.
    pub fn address(&self, conn: &Arc<Conn>, ranges: &DeviceRanges) -> CudaResult<u64> {
        if let Some(address) = self.address.get() {
            return *address;
        }
        let address = loaded(conn, ranges, self.module).and_then(|loaded| match loaded.variables.get(self.index as usize) {
            Some(Ok((address, _))) => Ok(*address),
            Some(Err(error)) => Err(*error),
            None => Err(CudaError::INVALID_SYMBOL),
        });
        *self.address.get_or_init(|| address)
    }
}
