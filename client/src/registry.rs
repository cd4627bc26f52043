//! The app's modules: images it loaded through the driver API (`cuModuleLoad*`, `cuLibraryLoad*`;
//! Flyt's runtime loads the fat binaries nvcc registers the same way), whose kernels and variables
//! are asked for by name, each once. An eager load is sent at once and its answer awaited; a lazy
//! one is sent with the first lookup of one of its kernels or variables, on the same connection,
//! so the two cost one round trip.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{CACHED_IMAGE_MIN, FuncAttributes, FunctionRef, ParamInfo, Request, decode_reply, image_digest, rep, req};

use crate::conn::{Conn, ReplySlot};
use crate::ranges::DeviceRanges;

pub use crate::images::Image;

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
    /// Not sent yet (no session, or it was loaded lazily and nothing of it was used yet). The
    /// image is kept only until the server holds it.
    Unsent(Image),
    /// Sent: with its bytes, or (`offered`, a large image) only its digest, in case the server's
    /// image cache has it; the image is kept until the answer says whether it must follow.
    Sent { slot: Arc<ReplySlot>, offered: Option<Image> },
    /// Answered. `bytes_followed`: the server lacked the offered image and it was sent after all,
    /// so lookups sent in between failed only for want of it and are worth asking again.
    Done { outcome: CudaResult<()>, bytes_followed: bool },
}

impl Registration {
    fn failed(error: CudaError) -> Self {
        Registration::Done { outcome: Err(error), bytes_followed: false }
    }
}

pub struct Module {
    pub id: u32,
    /// `cuModuleUnload`/`cuLibraryUnload` was called: its handles are dead.
    pub unloaded: bool,
    /// On the session's (first) server.
    registration: Arc<Mutex<Registration>>,
    /// On the further servers of a session spread over several (`Spread`), by their place in
    /// its list, each sent when first needed there.
    elsewhere: Arc<Mutex<HashMap<usize, Arc<Mutex<Registration>>>>>,
    /// A spread session's copy of the image, kept for the servers that have not had it yet.
    source: Arc<Mutex<Option<Image>>>,
    /// Kernels and variables found by name (driver API), each asked of the server once.
    found: Arc<Mutex<Found>>,
}

#[derive(Default)]
struct Found {
    functions: HashMap<String, Arc<Function>>,
    /// `(address, size, managed)` by name and session device (each device has its own copy).
    variables: HashMap<(String, u32), (u64, u64, bool)>,
    /// Every kernel's name, once asked for.
    names: Option<Arc<Vec<String>>>,
}

/// A kernel found by name in a loaded module.
pub struct Function {
    pub module: u32,
    pub index: u32,
    pub name: String,
    /// What the app holds: the base of a `CUfunction`/`CUkernel`.
    pub handle: usize,
    pub layout: Arc<Layout>,
    /// The driver's attributes, once asked (a set clears them).
    pub attributes: Mutex<Option<FuncAttributes>>,
    /// The values this process set, by `(device, attribute)`: setting one again is answered here
    /// (libraries set a kernel's dynamic shared memory before every launch; over a network each
    /// set would be a round trip).
    pub settings: Mutex<HashMap<(u32, u32), i32>>,
}

impl Function {
    pub fn reference(&self) -> FunctionRef {
        FunctionRef { module: self.module, index: self.index }
    }
}

#[derive(Default)]
pub struct Registry {
    pub modules: Vec<Module>,
    pub functions: Vec<Arc<Function>>,
}

pub static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(|| RwLock::new(Registry::default()));

/// The connections of a session spread over several servers (GPUs on several nodes), in the
/// session's order; unset for a session on one server. Every server loads a module the app uses
/// on any of them when a kernel of it is first looked up, and is asked for each kernel in the
/// same order, so a kernel's index (`FunctionRef`) is the same on every server and a launch on
/// any device names it alike.
static SPREAD: std::sync::OnceLock<Vec<Arc<Conn>>> = std::sync::OnceLock::new();

/// Makes modules known to every server of a spread session (`conns`, the first server's first).
pub fn spread_over(conns: Vec<Arc<Conn>>) {
    let _ = SPREAD.set(conns);
}

/// The servers modules go to: the given connection alone on one server, every one when spread.
fn servers(conn: &Arc<Conn>) -> Vec<Arc<Conn>> {
    SPREAD.get().cloned().unwrap_or_else(|| vec![conn.clone()])
}

/// A module's registration on the server `conn` leads to (its first server's on one server).
fn registration_on(conn: &Arc<Conn>, module: &Module) -> Arc<Mutex<Registration>> {
    let node = SPREAD.get().and_then(|conns| conns.iter().position(|spread| Arc::ptr_eq(spread, conn))).unwrap_or(0);
    if node == 0 {
        return module.registration.clone();
    }
    lock(&module.elsewhere)
        .entry(node)
        .or_insert_with(|| {
            // One lock at a time: `send_if_unsent_to` takes a registration's, then the source's.
            let kept = lock(&module.source).clone();
            let image = kept.or_else(|| match &*lock(&module.registration) {
                Registration::Unsent(image) => Some(image.clone()),
                _ => None,
            });
            Arc::new(Mutex::new(image.map_or_else(|| Registration::failed(CudaError::INVALID_RESOURCE_HANDLE), Registration::Unsent)))
        })
        .clone()
}

/// A module's registration on one server, with that server's connection (if the session has one).
type ServerRegistration = (Option<Arc<Conn>>, Arc<Mutex<Registration>>);

/// Every registration of a module so far, with its server's connection.
fn registrations(conn: Option<&Arc<Conn>>, module: &Module) -> Vec<ServerRegistration> {
    match SPREAD.get() {
        Some(conns) => {
            let mut all = vec![(conns.first().cloned(), module.registration.clone())];
            all.extend(lock(&module.elsewhere).iter().map(|(node, registration)| (conns.get(*node).cloned(), registration.clone())));
            all
        }
        None => vec![(conn.cloned(), module.registration.clone())],
    }
}

fn read() -> std::sync::RwLockReadGuard<'static, Registry> {
    REGISTRY.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write() -> std::sync::RwLockWriteGuard<'static, Registry> {
    REGISTRY.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn push_module(image: Image) -> u32 {
    let mut registry = write();
    let id = u32::try_from(registry.modules.len()).unwrap_or(u32::MAX);
    registry.modules.push(Module {
        id,
        unloaded: false,
        registration: Arc::new(Mutex::new(Registration::Unsent(image))),
        elsewhere: Arc::default(),
        source: Arc::default(),
        found: Arc::default(),
    });
    id
}

/// Loads an image through the driver API. Lazily, it is sent when something of it is first used;
/// eagerly, it is sent now and the server's answer is awaited, so a bad image fails here.
pub fn load(conn: Option<&Arc<Conn>>, image: Image, lazy: bool) -> CudaResult<u32> {
    let id = push_module(image);
    if lazy {
        return Ok(id);
    }
    let conn = conn.ok_or(CudaError::INITIALIZATION_ERROR)?;
    let registration = {
        let registry = read();
        let module = &registry.modules[id as usize];
        send_if_unsent(conn, module);
        registration_on(conn, module)
    };
    match collect(conn, id, &registration) {
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
    registry.modules.get(id as usize).filter(|module| !module.unloaded).ok_or(CudaError::INVALID_RESOURCE_HANDLE)
}

/// Unloads a module loaded through the driver API (`cuModuleUnload`, `cuLibraryUnload`): its
/// kernels and variables become unusable; the server drops it if it ever got it.
pub fn unload(conn: Option<&Arc<Conn>>, ranges: Option<&DeviceRanges>, id: u32) -> CudaResult<()> {
    let (registrations, found) = {
        let mut registry = write();
        let module = registry.modules.get_mut(id as usize).filter(|module| !module.unloaded).ok_or(CudaError::INVALID_RESOURCE_HANDLE)?;
        module.unloaded = true;
        lock(&module.source).take();
        (registrations(conn, module), module.found.clone())
    };
    for (_, registration) in &registrations {
        // Never sent: drop the image; nothing to tell the server.
        let mut registration = lock(registration);
        if matches!(*registration, Registration::Unsent(_)) {
            *registration = Registration::failed(CudaError::INVALID_RESOURCE_HANDLE);
        }
    }
    if let Some(ranges) = ranges {
        for (address, _, _) in lock(&found).variables.values() {
            ranges.remove_variable(*address);
        }
    }
    let mut outcome = Ok(());
    for (conn, registration) in registrations {
        if let Some(conn) = conn
            && held(&conn, id, &registration)
        {
            outcome = outcome.and(conn.send_async(&req::UnregisterModule { module: id }.into(), &[]));
        }
    }
    outcome
}

/// After a device reset: forgets every variable found so far (the server loaded the modules
/// again, and variables may have moved), so the next lookup asks anew.
pub fn forget_variables(ranges: &DeviceRanges) {
    let registry = read();
    for module in &registry.modules {
        for (_, (address, _, _)) in lock(&module.found).variables.drain() {
            ranges.remove_variable(address);
        }
    }
}

/// After a device reset: the server loaded the modules again, so their kernels' attributes are
/// the driver's defaults again.
pub fn forget_function_settings() {
    for function in &read().functions {
        lock(&function.settings).clear();
        *lock(&function.attributes) = None;
    }
}

/// A kernel of a live module by name: registered, found before, or asked of the server (which
/// loads a lazy module first, on the same connection, so the two cost one round trip).
pub fn function_by_name(conn: &Arc<Conn>, id: u32, name: &str) -> CudaResult<Arc<Function>> {
    let (on_each, found, source) = {
        let registry = read();
        let module = live(&registry, id)?;
        if let Some(function) = lock(&module.found).functions.get(name) {
            return Ok(function.clone());
        }
        let on_each = servers(conn).into_iter().map(|conn| (registration_on(&conn, module), conn)).collect::<Vec<_>>();
        (on_each, module.found.clone(), module.source.clone())
    };
    let mut reply: Option<rep::ModuleGetFunction> = None;
    for (registration, conn) in &on_each {
        send_if_unsent_to(conn, id, registration, &source);
        let here: rep::ModuleGetFunction = ask(conn, id, registration, req::ModuleGetFunction { module: id, name: name.to_owned() })?;
        if let Some(first) = &reply
            && first.index != here.index
        {
            crate::diagnostics::once(
                "spread-kernel-index",
                &format!(
                    "flyt: kernel {name} has another index on the server {} than on the first: it cannot run on every device (returning CUDA_ERROR_NOT_SUPPORTED)",
                    conn.server()
                ),
            );
            return Err(CudaError::NOT_SUPPORTED);
        }
        reply.get_or_insert(here);
    }
    let reply = reply.ok_or(CudaError::UNKNOWN)?;
    let mut registry = write();
    let handle = registry.functions.len() + 1;
    let function = Arc::new(Function {
        module: id,
        index: reply.index,
        name: name.to_owned(),
        handle,
        layout: Arc::new(Layout::new(reply.params)),
        attributes: Mutex::new(None),
        settings: Mutex::new(HashMap::new()),
    });
    registry.functions.push(function.clone());
    lock(&found).functions.insert(name.to_owned(), function.clone());
    Ok(function)
}

/// A `__device__`/`__constant__`/`__managed__` variable of a live module by name, as `(address,
/// size, managed)`. Device variables are added to `ranges` so copies may reach them; a managed
/// one is the caller's to mirror (copies reach the mirror, as host memory).
pub fn global_by_name(conn: &Arc<Conn>, ranges: &DeviceRanges, id: u32, name: &str) -> CudaResult<(u64, u64, bool)> {
    let (registration, found) = {
        let registry = read();
        let module = live(&registry, id)?;
        if let Some(global) = lock(&module.found).variables.get(&(name.to_owned(), crate::devices::thread_device())) {
            return Ok(*global);
        }
        send_if_unsent(conn, module);
        (registration_on(conn, module), module.found.clone())
    };
    let reply: rep::ModuleGetGlobal = ask(conn, id, &registration, req::ModuleGetGlobal { module: id, name: name.to_owned() })?;
    if !reply.managed {
        ranges.add_variables(std::iter::once((reply.address, reply.size)));
    }
    lock(&found).variables.insert((name.to_owned(), crate::devices::thread_device()), (reply.address, reply.size, reply.managed));
    Ok((reply.address, reply.size, reply.managed))
}

/// The names of a live module's kernels, in the driver's order, asked once per module.
pub fn function_names(conn: &Arc<Conn>, id: u32) -> CudaResult<Arc<Vec<String>>> {
    let (registration, found) = {
        let registry = read();
        let module = live(&registry, id)?;
        if let Some(names) = &lock(&module.found).names {
            return Ok(names.clone());
        }
        send_if_unsent(conn, module);
        (registration_on(conn, module), module.found.clone())
    };
    let reply: rep::ModuleFunctionNames = ask(conn, id, &registration, req::ModuleFunctionNames { module: id })?;
    let names = Arc::new(reply.names);
    lock(&found).names = Some(names.clone());
    Ok(names)
}

/// Asks the server about a module by name. A module the server could not load answers with why
/// (no code for this GPU, a bad image) rather than with the lookup's own error; one whose image
/// had to follow its digest is asked again, now that the server holds it.
fn ask<O: flyt_protocol::ops::Op>(conn: &Arc<Conn>, id: u32, registration: &Mutex<Registration>, request: O) -> CudaResult<O::Reply> {
    let request: Request = request.into();
    let call = || conn.call(&request).and_then(|message| decode_reply::<O::Reply>(&message).map_err(|_| CudaError::UNKNOWN)?.result);
    match call() {
        Ok(reply) => Ok(reply),
        Err(error) => match collect(conn, id, registration) {
            Err(load_error) => Err(load_error),
            Ok(true) => call(),
            Ok(false) => Err(error),
        },
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The kernel behind a handle, while its module is loaded.
pub fn function_by_handle(handle: usize) -> Option<Arc<Function>> {
    let registry = read();
    let function = registry.functions.get(handle.checked_sub(1)?)?;
    registry.modules.get(function.module as usize).filter(|module| !module.unloaded).map(|_| function.clone())
}

fn send_if_unsent(conn: &Arc<Conn>, module: &Module) {
    send_if_unsent_to(conn, module.id, &registration_on(conn, module), &module.source);
}

/// Sends module `id`'s registration on the server `conn` leads to, if not yet; in a spread
/// session its image is kept (`source`) for the servers still without it.
fn send_if_unsent_to(conn: &Arc<Conn>, id: u32, registration: &Mutex<Registration>, source: &Mutex<Option<Image>>) {
    let mut registration = lock(registration);
    if let Registration::Unsent(image) = &*registration {
        let image = image.clone();
        if SPREAD.get().is_some() {
            lock(source).get_or_insert_with(|| image.clone());
        }
        // A large image is offered by digest first: the server may have cached it.
        let cached = (image.bytes().len() >= CACHED_IMAGE_MIN).then(|| image_digest(image.bytes()));
        let request = req::RegisterModule { module: id, cached }.into();
        let bulk = if cached.is_some() { &[][..] } else { image.bytes() };
        *registration = match conn.send_with_bulk(&request, bulk, Some(())) {
            Ok(Some(slot)) => {
                if cached.is_none() {
                    crate::stats::image_sent(bulk.len());
                }
                Registration::Sent { slot, offered: cached.map(|_| image) }
            }
            Ok(None) => Registration::failed(CudaError::UNKNOWN),
            Err(error) => Registration::failed(error),
        };
    }
}

fn held(conn: &Arc<Conn>, id: u32, registration: &Mutex<Registration>) -> bool {
    let answered = match &*lock(registration) {
        Registration::Unsent(_) => return false,
        Registration::Sent { slot, .. } => slot.is_done(),
        Registration::Done { outcome, .. } => return outcome.is_ok(),
    };
    !answered || collect(conn, id, registration).is_ok()
}

/// Collects a sent registration's reply (once), sending the image's bytes when the server did not
/// have the offered one cached. Returns whether the bytes had to follow the offer.
fn collect(conn: &Arc<Conn>, id: u32, registration: &Mutex<Registration>) -> CudaResult<bool> {
    let mut registration = lock(registration);
    if let Registration::Sent { slot, offered } = &*registration {
        let (slot, offered) = (slot.clone(), offered.clone());
        let answer = wait_registered(conn, &slot);
        if offered.is_some() {
            // A load error still means the server had the image (it tried to load it).
            crate::stats::image_offered(answer.as_ref().is_ok_and(|needed| !needed) || answer.is_err());
        }
        *registration = match (answer, offered) {
            (Ok(false), _) => Registration::Done { outcome: Ok(()), bytes_followed: false },
            (Ok(true), Some(image)) => {
                crate::stats::image_sent(image.bytes().len());
                let request = req::RegisterModule { module: id, cached: None }.into();
                let resent = conn.send_with_bulk(&request, image.bytes(), Some(())).and_then(|slot| slot.ok_or(CudaError::UNKNOWN));
                match resent.and_then(|slot| wait_registered(conn, &slot)) {
                    Ok(false) => Registration::Done { outcome: Ok(()), bytes_followed: true },
                    Ok(true) => Registration::failed(CudaError::UNKNOWN),
                    Err(error) => Registration::failed(error),
                }
            }
            // The server asked for bytes it was sent: not a Flyt server this client understands.
            (Ok(true), None) => Registration::failed(CudaError::UNKNOWN),
            (Err(error), _) => Registration::failed(error),
        };
    }
    match &*registration {
        Registration::Done { outcome, bytes_followed } => outcome.map(|()| *bytes_followed),
        _ => Err(CudaError::UNKNOWN),
    }
}

/// Waits for a registration's reply: whether the server needs the image's bytes, or why it could
/// not load the module.
fn wait_registered(conn: &Conn, slot: &ReplySlot) -> CudaResult<bool> {
    let _ = conn.flush();
    let message = slot.wait()?;
    let reply = decode_reply::<rep::RegisterModule>(&message).map_err(|_| CudaError::UNKNOWN)?;
    reply.result.map(|reply| reply.image_needed)
}
