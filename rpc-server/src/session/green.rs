//! Green contexts of a session: the SM resources the driver described (the client names them by
//! ids given here, and only resources the driver wrote ever go back to it: their bytes hold the
//! driver's own bookkeeping), resource descriptors and green contexts named by the client's ids,
//! and the streams of each green context, which go with it.

use std::collections::{HashMap, HashSet, VecDeque};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{DevResource, dev_resource, rep, req};

use super::{MAX_HANDLES, Responder, Session};
use crate::backend::Device;

/// Resources kept for the client to name: the most recent this many (the driver has no call to
/// free one, and an app may ask again and again).
const RESOURCES_KEPT: usize = 4096;

/// The driver's `CUDA_ERROR_INVALID_CONTEXT` (the runtime numbers it 201 too).
const INVALID_CONTEXT: CudaError = CudaError::DEVICE_UNINITIALIZED;

struct Green<D: Device> {
    context: D::GreenCtx,
    /// Streams made in it, its default stream first among them.
    streams: HashSet<u64>,
}

/// The session's green contexts and what they are made from.
pub struct GreenTable<D: Device> {
    resources: HashMap<u64, D::Resource>,
    ids: HashMap<D::Resource, u64>,
    order: VecDeque<u64>,
    last_resource: u64,
    descs: HashMap<u64, D::ResourceDesc>,
    greens: HashMap<u64, Green<D>>,
}

impl<D: Device> Default for GreenTable<D> {
    fn default() -> Self {
        Self {
            resources: HashMap::new(),
            ids: HashMap::new(),
            order: VecDeque::new(),
            last_resource: 0,
            descs: HashMap::new(),
            greens: HashMap::new(),
        }
    }
}

impl<D: Device> GreenTable<D> {
    /// Why the session cannot move, if green contexts hold it.
    pub(super) fn move_blocker(&self) -> Option<String> {
        (!self.greens.is_empty())
            .then(|| format!("it made {} green context(s), whose SM partitions cannot be made again on the target yet", self.greens.len()))
    }

    /// A resource the driver wrote, under the id the client will name it by (the same id for
    /// the same bytes).
    fn remember(&mut self, resource: D::Resource) -> DevResource {
        let facts = D::resource_facts(&resource);
        let id = match self.ids.get(&resource) {
            Some(id) => *id,
            None => {
                self.last_resource += 1;
                let id = self.last_resource;
                self.ids.insert(resource.clone(), id);
                self.resources.insert(id, resource);
                self.order.push_back(id);
                while self.order.len() > RESOURCES_KEPT {
                    if let Some(old) = self.order.pop_front()
                        && let Some(resource) = self.resources.remove(&old)
                    {
                        self.ids.remove(&resource);
                    }
                }
                id
            }
        };
        DevResource { id, ..facts }
    }

    fn resource(&self, id: u64) -> CudaResult<&D::Resource> {
        self.resources.get(&id).ok_or(CudaError::INVALID_VALUE)
    }

    fn green(&self, id: u64) -> CudaResult<&Green<D>> {
        self.greens.get(&id).ok_or(INVALID_CONTEXT)
    }

    /// A stream was destroyed: it no longer goes with its green context.
    pub(super) fn forget_stream(&mut self, stream: u64) {
        for green in self.greens.values_mut() {
            green.streams.remove(&stream);
        }
    }
}

impl<D: Device> Session<D> {
    pub(super) fn get_dev_resource(&mut self, request: req::DevResourceGet, reply: Responder<rep::DevResourceGet>) {
        let result = (|| {
            if request.kind != dev_resource::SM {
                return Err(CudaError::INVALID_RESOURCE_TYPE);
            }
            let green = match request.green {
                0 => None,
                id => Some(self.green.green(id)?.context),
            };
            let resource = self.device.dev_resource(green, request.kind)?;
            Ok(self.green.remember(resource))
        })();
        reply.send(result.map(|resource| rep::DevResourceGet { resource }));
    }

    pub(super) fn split_dev_resource(&mut self, request: req::DevResourceSplit, reply: Responder<rep::DevResourceSplit>) {
        let result = (|| {
            let input = self.green.resource(request.input)?.clone();
            // No split makes more groups than the input has SMs: an app's larger array (natively
            // its size alone) costs the server nothing.
            let most = D::resource_facts(&input).sm_count.clamp(1, dev_resource::MAX_GROUPS);
            let groups = request.groups.map(|asked| asked.min(most));
            let split = self.device.sm_resource_split(&input, groups, request.flags, request.min_count)?;
            let groups = split.groups.into_iter().map(|group| self.green.remember(group)).collect();
            Ok(rep::DevResourceSplit { groups, count: split.count, remaining: self.green.remember(split.remaining) })
        })();
        reply.send(result);
    }

    pub(super) fn generate_resource_desc(&mut self, request: req::DevResourceDesc, reply: Responder<rep::DevResourceDesc>) {
        let result = (|| {
            if request.desc == 0 || self.green.descs.contains_key(&request.desc) || request.resources.is_empty() {
                return Err(CudaError::INVALID_VALUE);
            }
            if self.green.descs.len() >= MAX_HANDLES {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            let resources =
                request.resources.iter().map(|id| self.green.resource(*id).cloned()).collect::<CudaResult<Vec<D::Resource>>>()?;
            let desc = self.device.resource_desc(&resources)?;
            self.green.descs.insert(request.desc, desc);
            Ok(rep::DevResourceDesc {})
        })();
        reply.send(result);
    }

    /// A new stream id for the session: not one it holds.
    fn fresh_stream(&self, id: u64) -> CudaResult<()> {
        if id == 0 || self.streams.contains_key(&id) {
            Err(CudaError::INVALID_VALUE)
        } else if self.streams.len() >= MAX_HANDLES {
            Err(CudaError::MEMORY_ALLOCATION)
        } else {
            Ok(())
        }
    }

    pub(super) fn create_green_ctx(&mut self, request: req::GreenCtxCreate, reply: Responder<rep::GreenCtxCreate>) {
        let result = (|| {
            let desc = *self.green.descs.get(&request.desc).ok_or(CudaError::INVALID_VALUE)?;
            if request.green == 0 || self.green.greens.contains_key(&request.green) {
                return Err(CudaError::INVALID_VALUE);
            }
            if self.green.greens.len() >= MAX_HANDLES {
                return Err(CudaError::MEMORY_ALLOCATION);
            }
            self.fresh_stream(request.default_stream)?;
            let context = self.device.green_create(desc, request.flags)?;
            // Where the app's NULL-stream work goes while the green context is current: a
            // blocking stream of it, as the NULL stream of a context is.
            let stream = match self.device.green_stream_create(context, 0, 0) {
                Ok(stream) => stream,
                Err(error) => {
                    let _ = self.device.green_destroy(context);
                    return Err(error);
                }
            };
            self.streams.insert(request.default_stream, stream);
            self.stream_params.insert(request.default_stream, (0, 0));
            self.green.greens.insert(request.green, Green { context, streams: HashSet::from([request.default_stream]) });
            Ok(rep::GreenCtxCreate {})
        })();
        reply.send(result);
    }

    /// Destroys green context `id` and the streams made in it.
    fn destroy_green(&mut self, id: u64) -> CudaResult<()> {
        let green = self.green.greens.remove(&id).ok_or(INVALID_CONTEXT)?;
        for stream in &green.streams {
            self.stream_params.remove(stream);
            if let Some(handle) = self.streams.remove(stream) {
                let _ = self.device.stream_destroy(handle);
            }
            self.activity().stream_destroyed(*stream);
        }
        self.device.green_destroy(green.context)
    }

    pub(super) fn destroy_green_ctx(&mut self, request: req::GreenCtxDestroy, reply: Responder<rep::GreenCtxDestroy>) {
        let result = self.destroy_green(request.green);
        reply.send(result.map(|()| rep::GreenCtxDestroy {}));
    }

    pub(super) fn create_green_stream(&mut self, request: req::GreenStreamCreate, reply: Responder<rep::GreenStreamCreate>) {
        let result = (|| {
            let context = self.green.green(request.green)?.context;
            self.fresh_stream(request.stream)?;
            let stream = self.device.green_stream_create(context, request.flags, request.priority)?;
            self.streams.insert(request.stream, stream);
            self.stream_params.insert(request.stream, (request.flags, request.priority));
            if let Some(green) = self.green.greens.get_mut(&request.green) {
                green.streams.insert(request.stream);
            }
            Ok(rep::GreenStreamCreate {})
        })();
        reply.send(result);
    }

    pub(super) fn green_ctx_event_op(&mut self, request: req::GreenCtxEvent, reply: Responder<rep::GreenCtxEvent>) {
        let result = (|| {
            let context = self.green.green(request.green)?.context;
            let event = self.event(request.event)?;
            self.device.green_event(context, event, request.wait)
        })();
        reply.send(result.map(|()| rep::GreenCtxEvent {}));
    }

    /// Every green context goes (its streams went before), and what they were made from: at the
    /// session's end and before a device reset, which ends them in the driver too.
    pub(super) fn release_green(&mut self) {
        let ids: Vec<u64> = self.green.greens.keys().copied().collect();
        for id in ids {
            let _ = self.destroy_green(id);
        }
        self.green = GreenTable::default();
    }
}
