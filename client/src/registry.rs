//! The app's modules: fatbinaries it registered (from nvcc's static constructors, before `main`)
//! with their kernels and variables, and images it loaded through the driver API, whose kernels
//! and variables are asked for by name. Registration needs no server: a module is sent as one
//! request (image plus every registered kernel and variable name) once a session exists (a lazily
//! loaded driver module at its first use), and its reply (parameter layouts, variable addresses)
//! is collected the first time something needs it.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, RwLock};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{FuncAttributes, FunctionRef, ParamInfo, Request, decode_reply, rep, req};

use crate::conn::{Conn, ReplySlot};
use crate::ranges::DeviceRanges;

pub use crate::images::Image;

/// Reads the fatbinary a `__fatBinC_Wrapper_t` points at (nvcc's registration): it lives in the
/// app's executable for the life of the process.
///
/// # Safety
/// `wrapper` is NULL or the pointer nvcc's generated code passes to `__cudaRegisterFatBinary`.
pub unsafe fn image_from_wrapper(wrapper: *const c_void) -> Option<Image> {
    // SAFETY: forwarded contract; the executable's fat binaries are never unmapped.
    match unsafe { crate::images::image(wrapper, true) } {
        Some((image, crate::images::Kind::FatBinary)) => Some(image),
        _ => None,
    }
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
    /// Not sent yet (no session, the module is still being registered, or it was loaded lazily
    /// and nothing of it was used yet). The image is kept only until it is sent.
    Unsent(Image),
    Sent(Arc<ReplySlot>),
    Done(Result<Arc<Loaded>, CudaError>),
}

pub struct Module {
    pub id: u32,
    pub functions: Vec<String>,
    pub variables: Vec<String>,
    /// `__cudaRegisterFatBinaryEnd` was called: the name lists are complete.
    pub complete: bool,
    /// Sent at its first use rather than when the session opens (a driver-API load in lazy mode).
    pub lazy: bool,
    /// `cuModuleUnload`/`cuLibraryUnload` was called: its handles are dead.
    pub unloaded: bool,
    registration: Arc<Mutex<Registration>>,
    /// Kernels and variables found by name (driver API), each asked of the server once.
    found: Arc<Mutex<Found>>,
}

#[derive(Default)]
struct Found {
    functions: HashMap<String, Arc<Function>>,
    variables: HashMap<String, (u64, u64)>,
}

/// A kernel: registered by the app, or found by name in a loaded module.
pub struct Function {
    pub module: u32,
    pub index: u32,
    pub name: String,
    /// What the app holds: a `cudaKernel_t` or, in the driver front, the base of a `CUfunction`.
    pub handle: usize,
    layout: OnceLock<CudaResult<Arc<Layout>>>,
    /// The driver's attributes, once asked (a set clears them).
    pub attributes: Mutex<Option<FuncAttributes>>,
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

/// Records a fat binary nvcc's registration code hands over; its kernels and variables follow.
pub fn add_module(image: Image) -> u32 {
    push_module(image, false, false)
}

fn push_module(image: Image, complete: bool, lazy: bool) -> u32 {
    let mut registry = write();
    let id = u32::try_from(registry.modules.len()).unwrap_or(u32::MAX);
    registry.modules.push(Module {
        id,
        functions: Vec::new(),
        variables: Vec::new(),
        complete,
        lazy,
        unloaded: false,
        registration: Arc::new(Mutex::new(Registration::Unsent(image))),
        found: Arc::default(),
    });
    id
}

/// Loads an image through the driver API. Lazily, it is sent when something of it is first used;
/// eagerly, it is sent now and the server's answer is awaited, so a bad image fails here.
pub fn load(conn: Option<&Arc<Conn>>, image: Image, lazy: bool) -> CudaResult<u32> {
    let id = push_module(image, true, lazy);
    if lazy {
        return Ok(id);
    }
    let conn = conn.ok_or(CudaError::INITIALIZATION_ERROR)?;
    let registration = {
        let registry = read();
        let module = &registry.modules[id as usize];
        send_if_unsent(conn, module);
        module.registration.clone()
    };
    match collect(conn, None, &registration) {
        Ok(_) => Ok(id),
        Err(error) => {
            mark_unloaded(id);
            Err(error)
        }
    }
}

fn mark_unloaded(id: u32) {
    if let Some(module) = write().modules.get_mut(id as usize) {
        module.unloaded = true;
    }
}

/// A live module, or `INVALID_RESOURCE_HANDLE`.
fn live(registry: &Registry, id: u32) -> CudaResult<&Module> {
    registry.modules.get(id as usize).filter(|module| !module.unloaded && module.complete).ok_or(CudaError::INVALID_RESOURCE_HANDLE)
}

/// Unloads a module loaded through the driver API (`cuModuleUnload`, `cuLibraryUnload`): its
/// kernels and variables become unusable; the server drops it if it ever got it.
pub fn unload(conn: Option<&Arc<Conn>>, ranges: Option<&DeviceRanges>, id: u32) -> CudaResult<()> {
    let (registration, found) = {
        let mut registry = write();
        let module = registry.modules.get_mut(id as usize).filter(|module| !module.unloaded).ok_or(CudaError::INVALID_RESOURCE_HANDLE)?;
        module.unloaded = true;
        (module.registration.clone(), module.found.clone())
    };
    {
        // Never sent: drop the image; nothing to tell the server.
        let mut registration = lock(&registration);
        if matches!(*registration, Registration::Unsent(_)) {
            *registration = Registration::Done(Err(CudaError::INVALID_RESOURCE_HANDLE));
        }
    }
    let held = conn.is_some_and(|conn| held(conn, &registration));
    if let Some(ranges) = ranges {
        for (address, _) in lock(&found).variables.values() {
            ranges.remove_variable(*address);
        }
        if let Registration::Done(Ok(loaded)) = &*lock(&registration) {
            for (address, _) in loaded.variables.iter().filter_map(|v| v.as_ref().ok()) {
                ranges.remove_variable(*address);
            }
        }
    }
    match conn {
        Some(conn) if held => conn.send_async(&req::UnregisterModule { module: id }.into(), &[]),
        _ => Ok(()),
    }
}

/// A kernel of a live module by name: registered, found before, or asked of the server (which
/// loads a lazy module first, on the same connection, so the two cost one round trip).
pub fn function_by_name(conn: &Arc<Conn>, id: u32, name: &str) -> CudaResult<Arc<Function>> {
    let (registration, found) = {
        let registry = read();
        let module = live(&registry, id)?;
        if let Some(function) = lock(&module.found).functions.get(name) {
            return Ok(function.clone());
        }
        send_if_unsent(conn, module);
        (module.registration.clone(), module.found.clone())
    };
    let reply: rep::ModuleGetFunction = ask(conn, &registration, req::ModuleGetFunction { module: id, name: name.to_owned() })?;
    let mut registry = write();
    let handle = registry.functions.len() + 1;
    let function = Arc::new(Function {
        module: id,
        index: reply.index,
        name: name.to_owned(),
        handle,
        layout: OnceLock::from(Ok(Arc::new(Layout::new(reply.params)))),
        attributes: Mutex::new(None),
    });
    registry.functions.push(function.clone());
    lock(&found).functions.insert(name.to_owned(), function.clone());
    Ok(function)
}

/// A `__device__`/`__constant__` variable of a live module by name, as `(address, size)`; added to
/// `ranges` so copies may reach it.
pub fn global_by_name(conn: &Arc<Conn>, ranges: &DeviceRanges, id: u32, name: &str) -> CudaResult<(u64, u64)> {
    let (registration, found) = {
        let registry = read();
        let module = live(&registry, id)?;
        if let Some(global) = lock(&module.found).variables.get(name) {
            return Ok(*global);
        }
        send_if_unsent(conn, module);
        (module.registration.clone(), module.found.clone())
    };
    let reply: rep::ModuleGetGlobal = ask(conn, &registration, req::ModuleGetGlobal { module: id, name: name.to_owned() })?;
    ranges.add_variables(std::iter::once((reply.address, reply.size)));
    lock(&found).variables.insert(name.to_owned(), (reply.address, reply.size));
    Ok((reply.address, reply.size))
}

/// Asks the server about a module by name. A module the server could not load answers with why
/// (no code for this GPU, a bad image) rather than with the lookup's own error.
fn ask<O: flyt_protocol::ops::Op>(conn: &Arc<Conn>, registration: &Mutex<Registration>, request: O) -> CudaResult<O::Reply> {
    conn.call(&request.into())
        .and_then(|message| decode_reply::<O::Reply>(&message).map_err(|_| CudaError::UNKNOWN)?.result)
        .map_err(|error| collect(conn, None, registration).err().unwrap_or(error))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn add_function(module: u32, host_function: usize, name: String) {
    let mut registry = write();
    let Some(entry) = registry.modules.get_mut(module as usize) else {
        return;
    };
    let index = u32::try_from(entry.functions.len()).unwrap_or(u32::MAX);
    entry.functions.push(name.clone());
    let slot = registry.functions.len();
    let function = Arc::new(Function { module, index, name, handle: slot + 1, layout: OnceLock::new(), attributes: Mutex::new(None) });
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

/// The kernel behind a handle, while its module is loaded.
pub fn function_by_handle(handle: usize) -> Option<Arc<Function>> {
    let registry = read();
    let function = registry.functions.get(handle.checked_sub(1)?)?;
    registry.modules.get(function.module as usize).filter(|module| !module.unloaded).map(|_| function.clone())
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
    for module in registry.modules.iter().filter(|module| module.complete && !module.lazy && !module.unloaded) {
        send_if_unsent(conn, module);
    }
}

fn send_if_unsent(conn: &Arc<Conn>, module: &Module) {
    let mut registration = lock(&module.registration);
    if let Registration::Unsent(image) = &*registration {
        *registration = match conn.send_with_bulk(&registration_request(module), image.bytes(), Some(())) {
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
    held(conn, &registration)
}

fn held(conn: &Conn, registration: &Mutex<Registration>) -> bool {
    let answered = match &*lock(registration) {
        Registration::Unsent(_) => return false,
        Registration::Sent(slot) => slot.is_done(),
        Registration::Done(outcome) => return outcome.is_ok(),
    };
    !answered || collect(conn, None, registration).is_ok()
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
