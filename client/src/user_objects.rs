//! User objects (`cuUserObjectCreate`): reference-counted app objects whose destructor (an app
//! function) runs in this process. They are kept here, never on the server: counts are the
//! process's, and graphs and executable graphs hold references by the client's ids.
//!
//! Semantics: the destructor runs once, on a thread of its own (as the driver runs it on a
//! driver thread), after the last reference is released: the app's own, a graph's (released
//! when the graph is destroyed, or with `cuGraphReleaseUserObject`), or an executable graph's
//! (it takes a copy of its graph's references at instantiation and releases them when it is
//! destroyed). Every launch of an executable graph that holds references takes its own copy,
//! released by a host function queued after the launch on the same stream, so a destructor
//! never runs while a launch that uses the object may still run. Clones and child graph nodes
//! take copies of the references of the graph they copy. A launch captured into another graph
//! takes no per-launch copy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Mutex, OnceLock};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;

/// An app destructor: `destroy(ptr)`.
pub type Destructor = unsafe extern "C" fn(*mut std::ffi::c_void);

struct Object {
    destroy: Destructor,
    ptr: usize,
    refs: u64,
}

#[derive(Default)]
struct State {
    objects: HashMap<u64, Object>,
    /// References graphs, executable graphs and launches in flight hold: owner to
    /// (object, count).
    held: HashMap<u64, HashMap<u64, u64>>,
}

/// The process's user objects.
#[derive(Default)]
pub struct UserObjects {
    state: Mutex<State>,
    next_id: AtomicU64,
    destructors: OnceLock<Mutex<Sender<(Destructor, usize)>>>,
}

/// Owners of launch references are ids with this bit, apart from graph ids.
const LAUNCH_BIT: u64 = 1 << 62;

static USER_OBJECTS: OnceLock<UserObjects> = OnceLock::new();

/// The process's user objects.
pub fn user_objects() -> &'static UserObjects {
    USER_OBJECTS.get_or_init(UserObjects::default)
}

impl UserObjects {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new object with `refs` references held by the caller; its id (never 0).
    pub fn create(&self, ptr: usize, destroy: Destructor, refs: u32) -> CudaResult<u64> {
        if refs == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock().objects.insert(id, Object { destroy, ptr, refs: u64::from(refs) });
        Ok(id)
    }

    pub fn retain(&self, object: u64, count: u32) -> CudaResult<()> {
        let mut state = self.lock();
        let entry = state.objects.get_mut(&object).ok_or(CudaError::INVALID_VALUE)?;
        if count == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        entry.refs = entry.refs.saturating_add(u64::from(count));
        Ok(())
    }

    /// Drops references; the destructor is queued when the last one goes. Releasing more
    /// references than the object has is refused (the destructor never runs twice).
    pub fn release(&self, object: u64, count: u32) -> CudaResult<()> {
        if count == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        let mut state = self.lock();
        let dead = Self::drop_refs(&mut state, object, u64::from(count))?;
        drop(state);
        self.destroy(dead);
        Ok(())
    }

    /// Takes `count` references off `object`; the object, removed, if none are left.
    fn drop_refs(state: &mut State, object: u64, count: u64) -> CudaResult<Option<(Destructor, usize)>> {
        let entry = state.objects.get_mut(&object).ok_or(CudaError::INVALID_VALUE)?;
        if entry.refs < count {
            return Err(CudaError::INVALID_VALUE);
        }
        entry.refs -= count;
        if entry.refs > 0 {
            return Ok(None);
        }
        Ok(state.objects.remove(&object).map(|dead| (dead.destroy, dead.ptr)))
    }

    /// Runs destructors on the destructor thread (started at the first one).
    fn destroy(&self, dead: impl IntoIterator<Item = (Destructor, usize)>) {
        for (destroy, ptr) in dead {
            let sender = self.destructors.get_or_init(|| {
                let (sender, receiver) = channel::<(Destructor, usize)>();
                let spawned = std::thread::Builder::new().name("flyt-user-objects".into()).spawn(move || {
                    for (destroy, ptr) in receiver {
                        // SAFETY: the app's destructor and object from `cuUserObjectCreate`,
                        // called once, after the object's last reference was released.
                        unsafe { destroy(ptr as *mut std::ffi::c_void) };
                    }
                });
                if spawned.is_err() {
                    crate::diagnostics::once("user-object-thread", "flyt: could not start the user object destructor thread");
                }
                Mutex::new(sender)
            });
            let _ = sender.lock().unwrap_or_else(std::sync::PoisonError::into_inner).send((destroy, ptr));
        }
    }

    /// `cuGraphRetainUserObject`: `owner` (a graph) takes `count` references, new ones or, with
    /// `moved`, the caller's own.
    pub fn owner_retain(&self, owner: u64, object: u64, count: u32, moved: bool) -> CudaResult<()> {
        if count == 0 {
            return Err(CudaError::INVALID_VALUE);
        }
        if moved {
            // The caller's references change hands: the object must exist.
            if !self.lock().objects.contains_key(&object) {
                return Err(CudaError::INVALID_VALUE);
            }
        } else {
            self.retain(object, count)?;
        }
        *self.lock().held.entry(owner).or_default().entry(object).or_default() += u64::from(count);
        Ok(())
    }

    /// `cuGraphReleaseUserObject`: `owner` gives back `count` of the references it holds.
    pub fn owner_release(&self, owner: u64, object: u64, count: u32) -> CudaResult<()> {
        let mut state = self.lock();
        let held = state.held.get_mut(&owner).and_then(|held| held.get_mut(&object)).ok_or(CudaError::INVALID_VALUE)?;
        let count = u64::from(count);
        if count == 0 || *held < count {
            return Err(CudaError::INVALID_VALUE);
        }
        *held -= count;
        if *held == 0
            && let Some(held) = state.held.get_mut(&owner)
        {
            held.remove(&object);
        }
        let dead = Self::drop_refs(&mut state, object, count)?;
        drop(state);
        self.destroy(dead);
        Ok(())
    }

    /// An owner (graph, executable graph, finished launch) is gone: its references with it.
    pub fn owner_gone(&self, owner: u64) {
        let mut state = self.lock();
        let Some(held) = state.held.remove(&owner) else { return };
        let mut dead = Vec::new();
        for (object, count) in held {
            if let Ok(Some(object)) = Self::drop_refs(&mut state, object, count) {
                dead.push(object);
            }
        }
        drop(state);
        self.destroy(dead);
    }

    /// `to` takes a copy of the references `from` holds (instantiation, clone, child graph node).
    pub fn inherit(&self, from: u64, to: u64) {
        let mut state = self.lock();
        let Some(held) = state.held.get(&from).cloned() else { return };
        for (object, count) in &held {
            if let Some(entry) = state.objects.get_mut(object) {
                entry.refs = entry.refs.saturating_add(*count);
            }
        }
        let target = state.held.entry(to).or_default();
        for (object, count) in held {
            *target.entry(object).or_default() += count;
        }
    }

    /// `owner`'s references become a copy of those `from` holds, its old ones released (an
    /// executable graph updated from graph `from`, as CUDA's programming guide has it). Launches
    /// in flight keep their own.
    pub fn replace(&self, owner: u64, from: u64) {
        let mut state = self.lock();
        let new = state.held.get(&from).cloned().unwrap_or_default();
        for (object, count) in &new {
            if let Some(entry) = state.objects.get_mut(object) {
                entry.refs = entry.refs.saturating_add(*count);
            }
        }
        let old = if new.is_empty() { state.held.remove(&owner) } else { state.held.insert(owner, new) };
        let mut dead = Vec::new();
        for (object, count) in old.into_iter().flatten() {
            if let Ok(Some(object)) = Self::drop_refs(&mut state, object, count) {
                dead.push(object);
            }
        }
        drop(state);
        self.destroy(dead);
    }

    /// A launch of executable graph `exec`: if it holds references, a copy for the launch and
    /// the token `launch_done` releases it with.
    pub fn launch_references(&self, exec: u64) -> Option<u64> {
        if self.lock().held.get(&exec).is_none_or(|held| held.is_empty()) {
            return None;
        }
        let token = LAUNCH_BIT | (self.next_id.fetch_add(1, Ordering::Relaxed) + 1);
        self.inherit(exec, token);
        Some(token)
    }
}

/// The host function queued after a launch that holds user object references: releases them.
///
/// # Safety
/// `token` is a token from `launch_references` (any other value is ignored).
pub unsafe extern "C" fn launch_done(token: *mut std::ffi::c_void) {
    user_objects().owner_gone(token as usize as u64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    static DESTROYED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn count_destroy(ptr: *mut std::ffi::c_void) {
        DESTROYED.fetch_add(ptr as usize, Ordering::SeqCst);
    }

    /// Waits (up to a second) for `counter` to reach `total`, which it must then be.
    fn wait_until(counter: &AtomicUsize, total: usize) {
        for _ in 0..1000 {
            if counter.load(Ordering::SeqCst) >= total {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(counter.load(Ordering::SeqCst), total);
    }

    fn wait_for(total: usize) {
        wait_until(&DESTROYED, total);
    }

    static UPDATED_AWAY: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn count_update(ptr: *mut std::ffi::c_void) {
        UPDATED_AWAY.fetch_add(ptr as usize, Ordering::SeqCst);
    }

    #[test]
    fn an_update_swaps_the_executable_graphs_references_for_the_new_graphs() {
        let objects = UserObjects::default();
        // Destructor arguments 1 (the old graph's object) and 10 (the new one's) tell them apart.
        let (old, new) = (objects.create(1, count_update, 1).unwrap(), objects.create(10, count_update, 1).unwrap());
        let (graph_a, graph_b, exec) = (10_001, 10_002, 10_003);
        objects.owner_retain(graph_a, old, 1, true).unwrap();
        objects.owner_retain(graph_b, new, 1, true).unwrap();
        objects.inherit(graph_a, exec);
        objects.owner_gone(graph_a);
        objects.replace(exec, graph_b);
        // The old object's last reference was the executable graph's: it is destroyed.
        wait_until(&UPDATED_AWAY, 1);
        objects.owner_gone(graph_b);
        objects.owner_gone(exec);
        wait_until(&UPDATED_AWAY, 11);
    }

    #[test]
    fn the_destructor_runs_once_after_every_owner_let_go() {
        let objects = UserObjects::default();
        let object = objects.create(1, count_destroy, 2).unwrap();
        objects.owner_retain(10, object, 1, true).unwrap();
        objects.inherit(10, 20);
        let launch = objects.launch_references(20).unwrap();
        objects.release(object, 1).unwrap();
        objects.owner_gone(10);
        objects.owner_gone(20);
        assert_eq!(objects.release(object, 5), Err(CudaError::INVALID_VALUE), "only the launch's reference is left");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(DESTROYED.load(Ordering::SeqCst), 0, "the launch still holds it");
        objects.owner_gone(launch);
        wait_for(1);
        assert_eq!(objects.retain(object, 1), Err(CudaError::INVALID_VALUE), "gone");
        assert_eq!(objects.owner_release(10, object, 1), Err(CudaError::INVALID_VALUE));
    }
}
