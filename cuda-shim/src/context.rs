//! Contexts, answered entirely in the process: one primary context per device (retained and released
//! with a count), contexts made by `cuCtxCreate`, green contexts (made on the server) and the
//! contexts `cuCtxFromGreenCtx` gives for them, each thread's context stack, and context-local storage
//! (the runtime's per-context state, looked up on every launch).
//!
//! A `CUcontext` handed out is the address of a [`Context`] that stays allocated for the life of the
//! process (destroyed ones are only marked dead), so NVIDIA code that reads inside a handle, or a stale
//! handle used after destruction, always reads valid memory; a `CUgreenCtx` is the address of a
//! [`GreenContext`], kept the same way.

use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};

use crate::CUresult;
use crate::ffi::DriverResult;
use crate::generated::types::{CUcontext, CUgreenCtx};

/// The API version `cuCtxGetApiVersion` reports: every context of a current driver has the 3.2 ABI.
pub const API_VERSION: u32 = 3020;
/// `CU_CTX_FLAGS_MASK`: the flags a context can carry.
pub const CTX_FLAGS_MASK: u32 = 0xff;

/// A context-local storage destructor: `(ctx, key, data)`, called after the context died.
pub type ClsDestroy = Option<unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void)>;

struct ClsEntry {
    key: usize,
    data: usize,
    destroy: ClsDestroy,
}

#[derive(Default)]
struct State {
    /// Created contexts: until `cuCtxDestroy`. Primary contexts are never dead, only inactive.
    dead: bool,
    /// Primary contexts: the retain count (`active` = non-zero).
    retained: u32,
    cls: Vec<ClsEntry>,
}

/// What a `CUcontext` points at.
#[repr(C)]
pub struct Context {
    /// Zeros, first: NVIDIA code has been seen reading fields at small offsets inside context handles.
    readable: [u64; 32],
    id: u64,
    device: i32,
    primary: bool,
    /// For a context converted from a green context: that green context.
    green: OnceLock<&'static GreenContext>,
    flags: AtomicU32,
    /// `state.dead`, readable without the lock: every call that reaches the GPU checks it.
    destroyed: AtomicBool,
    state: Mutex<State>,
}

impl Context {
    fn new(device: i32, primary: bool, flags: u32) -> &'static Context {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Box::leak(Box::new(Context {
            readable: [0; 32],
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            device,
            primary,
            green: OnceLock::new(),
            flags: AtomicU32::new(flags),
            destroyed: AtomicBool::new(false),
            state: Mutex::new(State::default()),
        }))
    }

    pub fn handle(&'static self) -> CUcontext {
        std::ptr::from_ref(self).cast_mut().cast()
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn flags(&self) -> u32 {
        self.flags.load(Ordering::Relaxed)
    }

    /// `cuCtxSetFlags`: the flags `cuCtxGetFlags` answers from now on.
    pub fn set_flags(&self, flags: u32) -> DriverResult {
        if flags & !CTX_FLAGS_MASK != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.flags.store(flags, Ordering::Relaxed);
        Ok(())
    }

    pub fn is_primary(&self) -> bool {
        self.primary
    }

    /// The green context this context was converted from (`cuCtxFromGreenCtx`), if it was.
    pub fn green(&self) -> Option<&'static GreenContext> {
        self.green.get().copied()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// CUDA_ERROR_CONTEXT_IS_DESTROYED for a destroyed context.
    pub fn usable(&self) -> DriverResult {
        if self.destroyed.load(Ordering::Acquire) { Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED) } else { Ok(()) }
    }

    /// Primary contexts: whether something retains it.
    pub fn active(&self) -> bool {
        self.state().retained > 0
    }

    // -- context-local storage --

    pub fn cls_register(&self, key: *mut c_void, data: *mut c_void, destroy: ClsDestroy) -> DriverResult {
        let mut state = self.state();
        if state.dead {
            return Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
        }
        let (key, data) = (key as usize, data as usize);
        match state.cls.iter_mut().find(|e| e.key == key) {
            Some(entry) => {
                entry.data = data;
                entry.destroy = destroy;
            }
            None => state.cls.push(ClsEntry { key, data, destroy }),
        }
        Ok(())
    }

    pub fn cls_unregister(&self, key: *mut c_void) -> DriverResult {
        let mut state = self.state();
        let before = state.cls.len();
        state.cls.retain(|e| e.key != key as usize);
        if state.cls.len() == before { Err(CUresult::CUDA_ERROR_INVALID_HANDLE) } else { Ok(()) }
    }

    pub fn cls_get(&self, key: *mut c_void) -> DriverResult<*mut c_void> {
        let state = self.state();
        state.cls.iter().find(|e| e.key == key as usize).map(|e| e.data as *mut c_void).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Runs the destroy callbacks of every key still registered, after the context died (no lock held, so
    /// a callback may call back into the driver).
    fn run_cls_destructors(&'static self, entries: Vec<ClsEntry>) {
        for entry in entries {
            if let Some(destroy) = entry.destroy {
                // SAFETY: the callback and its key/data were registered together by the code that owns
                // them, for exactly this call when the context dies.
                unsafe { destroy(self.handle(), entry.key as *mut c_void, entry.data as *mut c_void) };
            }
        }
    }
}

/// What a `CUgreenCtx` points at: a green context the server made, under the client's id, with
/// the context that stands for it (`cuCtxFromGreenCtx`) and the server's stream of the work the
/// app queues on the NULL stream while that context is current.
#[repr(C)]
pub struct GreenContext {
    /// Zeros, first, as in [`Context`].
    readable: [u64; 32],
    id: u64,
    default_stream: u64,
    context: &'static Context,
}

impl GreenContext {
    pub fn handle(&'static self) -> CUgreenCtx {
        std::ptr::from_ref(self).cast_mut().cast()
    }

    /// Its id on the wire.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn default_stream(&self) -> u64 {
        self.default_stream
    }

    /// The context `cuCtxFromGreenCtx` gives (destroyed with the green context).
    pub fn context(&self) -> &'static Context {
        self.context
    }
}

/// The addresses of leaked `&'static T`s handed out as handles: a handle is a `T` only if it is
/// one of them.
struct HandedOut<T: 'static> {
    addresses: RwLock<HashSet<usize>>,
    kind: std::marker::PhantomData<&'static T>,
}

impl<T> Default for HandedOut<T> {
    fn default() -> Self {
        HandedOut { addresses: RwLock::default(), kind: std::marker::PhantomData }
    }
}

impl<T> HandedOut<T> {
    fn insert(&self, value: &'static T) {
        self.addresses.write().unwrap_or_else(std::sync::PoisonError::into_inner).insert(std::ptr::from_ref(value) as usize);
    }

    /// The `T` handed out at `address`, or CUDA_ERROR_INVALID_CONTEXT for anything else.
    fn get(&self, address: usize) -> DriverResult<&'static T> {
        if self.addresses.read().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&address) {
            // SAFETY: `address` was recorded in `insert` from a leaked `&'static T`, never freed.
            Ok(unsafe { &*(address as *const T) })
        } else {
            Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
        }
    }

    /// Every `T` handed out.
    fn all(&self) -> Vec<&'static T> {
        let addresses: Vec<usize> = self.addresses.read().unwrap_or_else(std::sync::PoisonError::into_inner).iter().copied().collect();
        addresses.into_iter().filter_map(|address| self.get(address).ok()).collect()
    }
}

/// Every context ever handed out, the primary contexts by device, and every green context.
#[derive(Default)]
pub struct Contexts {
    known: HandedOut<Context>,
    primaries: OnceLock<Vec<&'static Context>>,
    greens: HandedOut<GreenContext>,
}

thread_local! {
    static STACK: RefCell<Vec<&'static Context>> = const { RefCell::new(Vec::new()) };
}

impl Contexts {
    pub(crate) fn create_primaries(&self, devices: usize) {
        self.primaries.get_or_init(|| {
            (0..devices)
                .map(|d| {
                    let ctx = Context::new(d as i32, true, 0);
                    self.remember(ctx);
                    ctx
                })
                .collect()
        });
    }

    fn remember(&self, ctx: &'static Context) {
        self.known.insert(ctx);
    }

    /// The context a handle names, or CUDA_ERROR_INVALID_CONTEXT for anything this driver did not hand out.
    pub fn lookup(&self, handle: CUcontext) -> DriverResult<&'static Context> {
        self.known.get(handle as usize)
    }

    /// A handle argument where NULL means the thread's current context.
    pub fn lookup_or_current(&self, handle: CUcontext) -> DriverResult<&'static Context> {
        if handle.is_null() { current().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT) } else { self.lookup(handle) }
    }

    pub fn primary(&self, device: i32) -> DriverResult<&'static Context> {
        let primaries = self.primaries.get().ok_or(CUresult::CUDA_ERROR_NOT_INITIALIZED)?;
        usize::try_from(device).ok().and_then(|d| primaries.get(d)).copied().ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
    }

    // -- primary contexts --

    pub fn primary_retain(&self, device: i32) -> DriverResult<&'static Context> {
        let ctx = self.primary(device)?;
        ctx.state().retained += 1;
        Ok(ctx)
    }

    /// Drops one reference; the last one deactivates the context and runs its storage destructors.
    pub fn primary_release(&self, device: i32) -> DriverResult {
        let ctx = self.primary(device)?;
        let entries = {
            let mut state = ctx.state();
            if state.retained == 0 {
                return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
            }
            state.retained -= 1;
            if state.retained > 0 {
                return Ok(());
            }
            std::mem::take(&mut state.cls)
        };
        ctx.run_cls_destructors(entries);
        Ok(())
    }

    /// `cuDevicePrimaryCtxReset`: the context becomes inactive whatever its count, its storage destructors
    /// run; the handle stays the same (flags are kept). The device's green contexts, which hold the
    /// primary context, die with it (the server destroyed them).
    pub fn primary_reset(&self, device: i32) -> DriverResult {
        let ctx = self.primary(device)?;
        let entries = {
            let mut state = ctx.state();
            state.retained = 0;
            std::mem::take(&mut state.cls)
        };
        ctx.run_cls_destructors(entries);
        for green in self.greens.all() {
            if green.context.device == device && green.context.usable().is_ok() {
                let _ = Self::kill(green.context);
            }
        }
        Ok(())
    }

    /// `cuDevicePrimaryCtxSetFlags`; `allow_active` is false for the legacy entry point, which refuses
    /// while the context is active.
    pub fn primary_set_flags(&self, device: i32, flags: u32, allow_active: bool) -> DriverResult {
        let ctx = self.primary(device)?;
        if flags & !CTX_FLAGS_MASK != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if !allow_active && ctx.active() {
            return Err(CUresult::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE);
        }
        ctx.flags.store(flags, Ordering::Relaxed);
        Ok(())
    }

    // -- created contexts --

    /// `cuCtxCreate`: a new context, pushed on the calling thread's stack.
    pub fn create(&self, device: i32, flags: u32) -> DriverResult<&'static Context> {
        self.primary(device)?;
        if flags & !CTX_FLAGS_MASK != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = Context::new(device, false, flags);
        self.remember(ctx);
        push(ctx)?;
        Ok(ctx)
    }

    /// `cuCtxDestroy`: marks the context dead, pops it if it is this thread's current one, and runs its
    /// storage destructors. Primary contexts, and those of green contexts (which go with their green
    /// context), cannot be destroyed this way.
    pub fn destroy(&self, handle: CUcontext) -> DriverResult {
        let ctx = self.lookup(handle)?;
        if ctx.primary || ctx.green().is_some() {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        Self::kill(ctx)
    }

    /// Marks a context dead, pops it if it is this thread's current one, and runs its storage
    /// destructors.
    fn kill(ctx: &'static Context) -> DriverResult {
        let entries = {
            let mut state = ctx.state();
            if state.dead {
                return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
            }
            state.dead = true;
            ctx.destroyed.store(true, Ordering::Release);
            std::mem::take(&mut state.cls)
        };
        let _ = STACK.try_with(|stack| {
            let mut stack = stack.borrow_mut();
            if stack.last().is_some_and(|top| std::ptr::eq(*top, ctx)) {
                stack.pop();
            }
        });
        ctx.run_cls_destructors(entries);
        Ok(())
    }

    // -- green contexts --

    /// A green context the server made for `device` under `id`, with its NULL stream's stream.
    pub fn create_green(&self, device: i32, id: u64, default_stream: u64) -> DriverResult<&'static GreenContext> {
        self.primary(device)?;
        let context = Context::new(device, false, 0);
        let green = Box::leak(Box::new(GreenContext { readable: [0; 32], id, default_stream, context }));
        let _ = context.green.set(green);
        self.remember(context);
        self.greens.insert(green);
        Ok(green)
    }

    /// The green context a handle names, or CUDA_ERROR_INVALID_CONTEXT for anything this driver
    /// did not hand out.
    pub fn lookup_green(&self, handle: CUgreenCtx) -> DriverResult<&'static GreenContext> {
        self.greens.get(handle as usize)
    }

    /// `cuGreenCtxDestroy`, once the server destroyed it: its context dies as `cuCtxDestroy`
    /// makes a context die.
    pub fn destroy_green(&self, green: &'static GreenContext) -> DriverResult {
        green.context.usable()?;
        Self::kill(green.context)
    }
}

// -- the calling thread's context stack (a thread that is exiting has none) --

pub fn current() -> Option<&'static Context> {
    STACK.try_with(|stack| stack.borrow().last().copied()).ok().flatten()
}

/// The context the session's objects belong to, as the driver names it to a thread: the current
/// one, or device 0's primary one for a thread without a context (a thread that asks before any
/// other call, as PyTorch's pin-memory thread does). The session is one address space.
pub fn current_or_primary() -> DriverResult<&'static Context> {
    match current() {
        Some(context) => Ok(context),
        None => crate::driver::driver().contexts.primary(0),
    }
}

/// `cuCtxSetCurrent`: replaces the top of the stack (pushes onto an empty one); `None` pops.
pub fn set_current(ctx: Option<&'static Context>) -> DriverResult {
    STACK
        .try_with(|stack| {
            let mut stack = stack.borrow_mut();
            match ctx {
                Some(ctx) => match stack.last_mut() {
                    Some(top) => *top = ctx,
                    None => stack.push(ctx),
                },
                None => {
                    stack.pop();
                }
            }
        })
        .map_err(|_| CUresult::CUDA_ERROR_DEINITIALIZED)?;
    follow_current_device();
    Ok(())
}

pub fn push(ctx: &'static Context) -> DriverResult {
    STACK.try_with(|stack| stack.borrow_mut().push(ctx)).map_err(|_| CUresult::CUDA_ERROR_DEINITIALIZED)?;
    follow_current_device();
    Ok(())
}

pub fn pop() -> DriverResult<&'static Context> {
    let popped = STACK
        .try_with(|stack| stack.borrow_mut().pop())
        .map_err(|_| CUresult::CUDA_ERROR_DEINITIALIZED)?
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    follow_current_device();
    Ok(popped)
}

/// Tells the session which device the thread's requests run on now: its current context's (the
/// first device without one). A thread's work then reaches the server with that device current.
fn follow_current_device() {
    if let Some(client) = flyt_client::client::existing_client() {
        client.set_thread_device(current().map_or(0, |ctx| ctx.device().max(0) as usize));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn contexts(devices: usize) -> Contexts {
        let contexts = Contexts::default();
        contexts.create_primaries(devices);
        contexts
    }

    #[test]
    fn primary_context_is_refcounted_and_keeps_its_handle() {
        let c = contexts(2);
        let first = c.primary(1).unwrap();
        assert!(!first.active());
        assert_eq!(c.primary_retain(1).unwrap().handle(), first.handle());
        c.primary_retain(1).unwrap();
        assert!(first.active());
        c.primary_release(1).unwrap();
        assert!(first.active());
        c.primary_release(1).unwrap();
        assert!(!first.active());
        assert_eq!(c.primary_release(1), Err(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        assert_eq!(c.primary(2).err(), Some(CUresult::CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(first.device(), 1);
    }

    #[test]
    fn set_flags_checks_mask_and_legacy_refuses_when_active() {
        let c = contexts(1);
        assert_eq!(c.primary_set_flags(0, 0x100, true), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        c.primary_set_flags(0, 4, false).unwrap();
        c.primary_retain(0).unwrap();
        assert_eq!(c.primary_set_flags(0, 1, false), Err(CUresult::CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE));
        c.primary_set_flags(0, 1, true).unwrap();
        assert_eq!(c.primary(0).unwrap().flags(), 1);
    }

    #[test]
    fn stack_push_pop_set() {
        let c = contexts(1);
        let primary = c.primary(0).unwrap();
        assert!(current().is_none());
        assert_eq!(pop().err(), Some(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        set_current(Some(primary)).unwrap();
        let created = c.create(0, 0).unwrap();
        assert!(std::ptr::eq(current().unwrap(), created));
        assert!(std::ptr::eq(pop().unwrap(), created));
        assert!(std::ptr::eq(current().unwrap(), primary));
        set_current(None).unwrap();
        assert!(current().is_none());
    }

    #[test]
    fn unknown_handles_are_invalid_contexts() {
        let c = contexts(1);
        let mut not_a_context = 0u64;
        let handle: CUcontext = std::ptr::from_mut(&mut not_a_context).cast();
        assert_eq!(c.lookup(handle).err(), Some(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        assert_eq!(c.lookup_or_current(std::ptr::null_mut()).err(), Some(CUresult::CUDA_ERROR_INVALID_CONTEXT));
    }

    #[test]
    fn a_green_context_has_a_context_of_its_own_that_goes_with_it() {
        let c = contexts(1);
        let green = c.create_green(0, 7, 0x5_0000_0009).unwrap();
        assert_eq!(c.create_green(1, 8, 0x5_0000_000a).err(), Some(CUresult::CUDA_ERROR_INVALID_DEVICE));
        assert!(std::ptr::eq(c.lookup_green(green.handle()).unwrap(), green));
        let ctx = green.context();
        assert!(std::ptr::eq(c.lookup(ctx.handle()).unwrap(), ctx), "its context is a context of this driver");
        assert!(std::ptr::eq(ctx.green().unwrap(), green));
        assert!(!ctx.is_primary() && c.primary(0).unwrap().green().is_none());
        assert_eq!((green.id(), green.default_stream()), (7, 0x5_0000_0009));
        // Neither handle passes for the other.
        assert_eq!(c.lookup_green(ctx.handle().cast()).err(), Some(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        assert_eq!(c.lookup(green.handle().cast()).err(), Some(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        // Only the green context's destruction ends its context, popping it when current.
        assert_eq!(c.destroy(ctx.handle()), Err(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        push(ctx).unwrap();
        c.destroy_green(green).unwrap();
        assert!(current().is_none());
        assert_eq!(ctx.usable(), Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED));
        assert_eq!(c.destroy_green(green), Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED));
        // A reset of the primary context ends the device's green contexts too.
        let other = c.create_green(0, 9, 0x5_0000_000b).unwrap();
        c.primary_reset(0).unwrap();
        assert_eq!(other.context().usable(), Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED));
    }

    static DESTROYED: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn count_destroy(_ctx: CUcontext, _key: *mut c_void, data: *mut c_void) {
        DESTROYED.fetch_add(data as usize, Ordering::SeqCst);
    }

    #[test]
    fn cls_destructors_run_when_a_context_dies_not_on_unregister() {
        let c = contexts(1);
        let (k1, k2, k3) =
            (std::ptr::without_provenance_mut(8), std::ptr::without_provenance_mut(16), std::ptr::without_provenance_mut(24));
        let created = c.create(0, 0).unwrap();
        created.cls_register(k1, 100usize as *mut c_void, Some(count_destroy)).unwrap();
        created.cls_register(k2, 20usize as *mut c_void, Some(count_destroy)).unwrap();
        assert_eq!(created.cls_get(k1).unwrap() as usize, 100);
        assert_eq!(created.cls_get(k3).err(), Some(CUresult::CUDA_ERROR_INVALID_HANDLE));
        created.cls_unregister(k2).unwrap();
        assert_eq!(created.cls_unregister(k2), Err(CUresult::CUDA_ERROR_INVALID_HANDLE));
        let before = DESTROYED.load(Ordering::SeqCst);
        c.destroy(created.handle()).unwrap();
        assert_eq!(DESTROYED.load(Ordering::SeqCst) - before, 100, "only the still-registered key's destructor");
        assert!(current().is_none(), "destroying the current context pops it");
        assert_eq!(created.usable(), Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED));
        assert_eq!(c.destroy(created.handle()), Err(CUresult::CUDA_ERROR_INVALID_CONTEXT));

        let primary = c.primary_retain(0).unwrap();
        primary.cls_register(k3, 5000usize as *mut c_void, Some(count_destroy)).unwrap();
        let before = DESTROYED.load(Ordering::SeqCst);
        c.primary_reset(0).unwrap();
        assert_eq!(DESTROYED.load(Ordering::SeqCst) - before, 5000);
        assert!(!primary.active());
        assert_eq!(c.destroy(primary.handle()), Err(CUresult::CUDA_ERROR_INVALID_CONTEXT));
    }
}
