//! Stream-ordered allocation and memory pools for a session: pools under client-chosen ids
//! (`DEFAULT_POOL` is the device's default), allocations counted in the quota from the
//! allocation to the free and checked like any other. A session moves with its pools: each is
//! made again with the attributes and access the app set, and the pools' live allocations come
//! back at their addresses with the session's other allocations (the device frees those in
//! stream order too).

use std::collections::{BTreeMap, HashMap};

use flyt_protocol::CudaError;
use flyt_protocol::ops::{DEFAULT_POOL, rep, req};

use serde::{Deserialize, Serialize};

use super::{MAX_HANDLES, Responder, Session};
use crate::backend::Device;
use crate::memory::RangeKind;

/// Pool attributes an app may set (reuse policies and the release threshold): the ones a moved
/// pool gets again.
const SETTABLE_ATTRIBUTES: std::ops::RangeInclusive<u32> = 1..=4;

/// What the app set on one pool.
#[derive(Clone, Default, Serialize, Deserialize)]
struct PoolSettings {
    attributes: BTreeMap<u32, u64>,
    access: Option<u32>,
}

/// The session's pools and which one the device allocates from.
pub struct PoolTable<D: Device> {
    pools: HashMap<u64, D::MemPool>,
    settings: HashMap<u64, PoolSettings>,
    current: u64,
}

impl<D: Device> Default for PoolTable<D> {
    fn default() -> Self {
        Self { pools: HashMap::new(), settings: HashMap::new(), current: DEFAULT_POOL }
    }
}

/// The session's pools in a snapshot: each pool's id (the default one too, when the app named
/// it) and settings, and the current pool.
#[derive(Serialize, Deserialize)]
pub(super) struct PoolsState {
    pools: Vec<(u64, PoolSettings)>,
    current: u64,
}

impl<D: Device> PoolTable<D> {
    pub(super) fn state(&self) -> PoolsState {
        let mut pools: Vec<_> = self.pools.keys().map(|id| (*id, self.settings.get(id).cloned().unwrap_or_default())).collect();
        pools.sort_unstable_by_key(|(id, _)| *id);
        PoolsState { pools, current: self.current }
    }

    /// Makes the pools of `state` again on `device` (a fresh worker's; one whose restore fails
    /// exits, and the driver frees what it made).
    pub(super) fn restore(device: &D, state: PoolsState) -> Result<Self, String> {
        let mut table = Self { current: state.current, ..Self::default() };
        for (id, settings) in state.pools {
            let pool = match id {
                DEFAULT_POOL => device.default_pool(),
                _ => device.pool_create(),
            }
            .map_err(|error| format!("memory pool {id}: {error}"))?;
            table.pools.insert(id, pool);
            for (&attribute, &value) in &settings.attributes {
                device
                    .pool_attribute(pool, attribute, Some(value))
                    .map_err(|error| format!("memory pool {id}'s attribute {attribute}: {error}"))?;
            }
            if let Some(flags) = settings.access {
                device.pool_access(pool, Some(flags)).map_err(|error| format!("memory pool {id}'s access: {error}"))?;
            }
            table.settings.insert(id, settings);
        }
        if table.current != DEFAULT_POOL {
            let pool = *table.pools.get(&table.current).ok_or("the current memory pool is not among the session's")?;
            device.set_current_pool(pool).map_err(|error| format!("the current memory pool: {error}"))?;
        }
        Ok(table)
    }
}

impl<D: Device> Session<D> {
    /// A pool by id; the default pool is looked up on first use.
    fn pool(&mut self, id: u64) -> Result<D::MemPool, CudaError> {
        let id = if id == 0 { self.pools.current } else { id };
        if let Some(pool) = self.pools.pools.get(&id) {
            return Ok(*pool);
        }
        if id != DEFAULT_POOL {
            return Err(CudaError::INVALID_VALUE);
        }
        let pool = self.device.default_pool()?;
        self.pools.pools.insert(DEFAULT_POOL, pool);
        Ok(pool)
    }

    /// Destroys the pools the session created (it ends).
    pub(super) fn release_pools(&mut self) {
        for (id, pool) in self.pools.pools.drain() {
            if id != DEFAULT_POOL {
                let _ = self.device.pool_destroy(pool);
            }
        }
        self.pools.settings.clear();
        self.pools.current = DEFAULT_POOL;
    }

    pub(super) fn pool_alloc_async(&mut self, request: req::MemAllocAsync, reply: Responder<rep::MemAllocAsync>) {
        let result = (|| {
            if request.size == 0 {
                return Ok(rep::MemAllocAsync { ptr: 0 });
            }
            let stream = self.stream(request.stream)?;
            let pool = self.pool(request.pool)?;
            if !self.budget.try_reserve(request.size) {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            match self.device.alloc_async(request.size, pool, stream) {
                Ok(ptr) => {
                    self.ranges.insert(ptr, request.size, RangeKind::Allocation);
                    Ok(rep::MemAllocAsync { ptr })
                }
                Err(error) => {
                    self.budget.release(request.size);
                    Err(error)
                }
            }
        })();
        reply.send(result);
    }

    pub(super) fn pool_free_async(&mut self, request: req::MemFreeAsync, reply: Responder<rep::MemFreeAsync>) {
        let result = self.stream(request.stream).and_then(|stream| {
            let len = self.ranges.remove_allocation(request.ptr)?;
            self.budget.release(len);
            self.device.free_async(request.ptr, stream)
        });
        reply.send(result.map(|()| rep::MemFreeAsync {}));
    }

    pub(super) fn pool_attribute(&mut self, request: req::MemPoolAttribute, reply: Responder<rep::MemPoolAttribute>) {
        let id = if request.pool == 0 { self.pools.current } else { request.pool };
        let result = self.pool(id).and_then(|pool| self.device.pool_attribute(pool, request.attribute, request.value));
        if let (Ok(_), Some(value)) = (&result, request.value)
            && SETTABLE_ATTRIBUTES.contains(&request.attribute)
        {
            self.pools.settings.entry(id).or_default().attributes.insert(request.attribute, value);
        }
        reply.send(result.map(|value| rep::MemPoolAttribute { value }));
    }

    pub(super) fn pool_trim(&mut self, request: req::MemPoolTrim, reply: Responder<rep::MemPoolTrim>) {
        let result = self.pool(request.pool).and_then(|pool| self.device.pool_trim(pool, request.keep));
        reply.send(result.map(|()| rep::MemPoolTrim {}));
    }

    pub(super) fn pool_create(&mut self, request: req::MemPoolCreate, reply: Responder<rep::MemPoolCreate>) {
        let result =
            if request.pool <= DEFAULT_POOL || self.pools.pools.contains_key(&request.pool) || self.pools.pools.len() >= MAX_HANDLES {
                Err(CudaError::INVALID_VALUE)
            } else {
                self.device.pool_create().map(|pool| {
                    self.pools.pools.insert(request.pool, pool);
                    rep::MemPoolCreate {}
                })
            };
        reply.send(result);
    }

    pub(super) fn pool_destroy(&mut self, request: req::MemPoolDestroy, reply: Responder<rep::MemPoolDestroy>) {
        let result = match self.pools.pools.get(&request.pool) {
            Some(pool) if request.pool != DEFAULT_POOL => {
                let pool = *pool;
                self.device.pool_destroy(pool).map(|()| {
                    self.pools.pools.remove(&request.pool);
                    self.pools.settings.remove(&request.pool);
                    // The device goes back to its default pool, as the driver does.
                    if self.pools.current == request.pool {
                        self.pools.current = DEFAULT_POOL;
                    }
                    rep::MemPoolDestroy {}
                })
            }
            _ => Err(CudaError::INVALID_VALUE),
        };
        reply.send(result);
    }

    pub(super) fn pool_current(&mut self, request: req::DeviceMemPool, reply: Responder<rep::DeviceMemPool>) {
        let result = (|| {
            if let Some(id) = request.set {
                let pool = self.pool(id.max(DEFAULT_POOL))?;
                self.device.set_current_pool(pool)?;
                self.pools.current = id.max(DEFAULT_POOL);
            }
            Ok(rep::DeviceMemPool { pool: self.pools.current })
        })();
        reply.send(result);
    }

    pub(super) fn pool_access(&mut self, request: req::MemPoolAccess, reply: Responder<rep::MemPoolAccess>) {
        let id = if request.pool == 0 { self.pools.current } else { request.pool };
        let result = self.pool(id).and_then(|pool| self.device.pool_access(pool, request.set));
        if let (Ok(_), Some(flags)) = (&result, request.set) {
            self.pools.settings.entry(id).or_default().access = Some(flags);
        }
        reply.send(result.map(|flags| rep::MemPoolAccess { flags }));
    }
}
