//! JIT linking (`cuLink*`): each link lives on the server under an id chosen here; its inputs are
//! sent as they are added (the driver compiles PTX then, and reports errors there), and the
//! linked cubin is read back in copy-sized pieces once complete.

use std::sync::atomic::{AtomicU64, Ordering};

use flyt_protocol::CudaError;
use flyt_protocol::error::CudaResult;
use flyt_protocol::ops::{JitOption, LinkOutcome, req};

use crate::client::Client;
use crate::conn::HostDestination;

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

/// Starts a link on the server; returns its id. `info_log`/`error_log`: the app's buffer sizes.
pub fn create(client: &Client, options: Vec<JitOption>, info_log: u32, error_log: u32) -> CudaResult<u64> {
    let link = NEXT_LINK.fetch_add(1, Ordering::Relaxed);
    client.call(req::LinkCreate { link, options, info_log, error_log })?;
    Ok(link)
}

/// Adds one input (`CUjitInputType` `kind`), waiting for the driver's verdict.
pub fn add(client: &Client, link: u64, kind: u32, name: String, data: &[u8], options: Vec<JitOption>) -> CudaResult<LinkOutcome> {
    client.call_with_bulk(req::LinkAdd { link, kind, name, options }, data).map(|reply| reply.outcome)
}

/// Completes the link and reads its cubin back (empty when linking failed).
pub fn complete(client: &Client, link: u64) -> CudaResult<(LinkOutcome, Vec<u8>)> {
    let completed = client.call(req::LinkComplete { link })?;
    if completed.outcome.error.is_some() {
        return Ok((completed.outcome, Vec::new()));
    }
    let size = usize::try_from(completed.size).map_err(|_| CudaError::UNKNOWN)?;
    let mut cubin = vec![0u8; size];
    let chunk = usize::try_from(client.info.copy_chunk.max(4096)).unwrap_or(4096);
    for (index, piece) in cubin.chunks_mut(chunk).enumerate() {
        let request = req::LinkRead { link, offset: (index * chunk) as u64, len: piece.len() as u64 };
        // SAFETY: `piece` is a buffer of this function, written only by the reply to this read,
        // which `call_into` awaits before the buffer is touched or dropped.
        let destination = unsafe { HostDestination::new(piece.as_mut_ptr(), piece.len()) };
        client.call_into(request, destination)?;
    }
    Ok((completed.outcome, cubin))
}

/// Ends the link on the server (no round trip; an unknown id is a deferred error).
pub fn destroy(client: &Client, link: u64) -> CudaResult<()> {
    client.post(req::LinkDestroy { link })
}
