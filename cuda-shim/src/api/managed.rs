//! Managed memory (`cuMemAllocManaged`) and its hints: prefetches, advice, stream attachment and
//! the range queries. The memory is a block of the shared-memory segment mapped at the same
//! address in the app and the server, or without the channel mirrored device memory
//! (`flyt_client::managed`); the hints are checked and recorded, and move nothing.
#![allow(clippy::too_many_arguments, reason = "the driver API's batch signatures")]

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use flyt_client::managed::{self, ATTACH_GLOBAL, ATTACH_HOST, ATTACH_SINGLE, DEVICE_INVALID, Location, RangeValue};
use flyt_protocol::CudaError;

use super::session::{client, driver_error, resolve_stream, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{CUdevice, CUdeviceptr, CUmem_advise, CUmem_range_attribute, CUmemLocation, CUstream};

pub unsafe fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult {
    run(|| {
        non_null([dptr.cast()])?;
        if bytesize == 0 || (flags != ATTACH_GLOBAL && flags != ATTACH_HOST) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ptr = managed::alloc(client()?, bytesize, flags).map_err(|error| {
            if error == CudaError::MEMORY_ALLOCATION {
                crate::diagnostics::once(
                    "cuMemAllocManaged full",
                    "flyt: cuMemAllocManaged: no room for managed memory (the shared-memory segment, FLYT_SHM_SIZE sets its size, or the device; returning CUDA_ERROR_OUT_OF_MEMORY)",
                );
            }
            driver_error(error)
        })?;
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(dptr, ptr) }
    })
}

fn location(location: CUmemLocation) -> Location {
    Location { kind: location.r#type, id: location.id }
}

fn prefetch(ptr: CUdeviceptr, count: usize, to: Location, flags: c_ulonglong, stream: CUstream, ptsz: bool) -> DriverResult {
    let client = client()?;
    resolve_stream(client, stream, ptsz)?;
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    client.managed().prefetch(client, ptr, count as u64, to).map_err(driver_error)?;
    // Mirrored managed memory (no channel): to the device, the host's changes go now; to the CPU,
    // the next synchronization after device work fetches the device's bytes anyway.
    if to.kind == managed::location_type::DEVICE && client.managed().device_backed(ptr, count as u64) {
        client.send_host_changes().map_err(driver_error)?;
    }
    Ok(())
}

per_thread_twins! {
    cuMemPrefetchAsync, cuMemPrefetchAsync_ptsz (dev_ptr: CUdeviceptr, count: usize, dst_device: CUdevice, h_stream: CUstream)
        |per_thread| run(|| prefetch(dev_ptr, count, Location::from_legacy(dst_device), 0, h_stream, per_thread))
}

per_thread_twins! {
    cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz
        (
            dev_ptr: CUdeviceptr,
            count: usize,
            to: CUmemLocation,
            flags: c_uint,
            h_stream: CUstream,
        )
        |per_thread| run(|| prefetch(dev_ptr, count, location(to), flags.into(), h_stream, per_thread))
}

/// The ranges of a batch call, as `(pointer, size)`.
///
/// # Safety
/// `dptrs` and `sizes` hold `count` entries each (the driver API's contract).
unsafe fn batch_ranges(dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize) -> DriverResult<Vec<(u64, u64)>> {
    if count == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    non_null([dptrs.cast(), sizes.cast()])?;
    // SAFETY: `count` entries each, per this function's contract.
    let (pointers, sizes) = unsafe { (std::slice::from_raw_parts(dptrs, count), std::slice::from_raw_parts(sizes, count)) };
    Ok(pointers.iter().zip(sizes).map(|(ptr, size)| (*ptr, *size as u64)).collect())
}

/// A batch of prefetches: `locations[i]` applies from range `starts[i]` up to the next start.
/// With a discard first, the same: the pages keep their contents, which a discard allows.
///
/// # Safety
/// Each array holds its count of entries (the driver API's contract).
unsafe fn prefetch_batch(
    dptrs: *mut CUdeviceptr,
    sizes: *mut usize,
    count: usize,
    locations: *mut CUmemLocation,
    starts: *mut usize,
    num_locations: usize,
    flags: c_ulonglong,
    stream: CUstream,
    ptsz: bool,
) -> DriverResult {
    // SAFETY: forwarded contract.
    let ranges = unsafe { batch_ranges(dptrs, sizes, count) }?;
    if num_locations == 0 || num_locations > count {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    non_null([locations.cast(), starts.cast()])?;
    // SAFETY: `num_locations` entries each, per this function's contract.
    let (locations, starts) =
        unsafe { (std::slice::from_raw_parts(locations, num_locations), std::slice::from_raw_parts(starts, num_locations)) };
    // The first location applies from the first range; starts rise and stay inside the batch.
    if starts[0] != 0 || starts.windows(2).any(|pair| pair[0] >= pair[1]) || starts[num_locations - 1] >= count {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let client = client()?;
    check_batch_stream(client, stream, ptsz)?;
    // The whole batch is checked before any of it is recorded.
    check_batch(client, &ranges)?;
    let targets = locations.iter().map(|to| location(*to).check(client).map_err(driver_error)).collect::<DriverResult<Vec<_>>>()?;
    for (index, (ptr, size)) in ranges.into_iter().enumerate() {
        let which = starts.partition_point(|start| *start <= index) - 1;
        prefetch(ptr, size as usize, targets[which], flags, stream, ptsz)?;
    }
    Ok(())
}

/// Batches take a stream the app created or a per-thread default stream, never the legacy one.
fn check_batch_stream(client: &flyt_client::client::Client, stream: CUstream, ptsz: bool) -> DriverResult {
    if super::session::is_legacy_stream(client, stream, ptsz)? { Err(CUresult::CUDA_ERROR_INVALID_VALUE) } else { Ok(()) }
}

/// Every range of a batch is managed memory.
fn check_batch(client: &flyt_client::client::Client, ranges: &[(u64, u64)]) -> DriverResult {
    ranges.iter().try_for_each(|(ptr, size)| client.managed().check(*ptr, *size).map(drop).map_err(driver_error))
}

/// A discard lets the driver drop the pages' contents; keeping them is one of the outcomes it
/// allows (a later read sees unspecified values), so the ranges are only checked.
fn discard(dptrs: *mut CUdeviceptr, sizes: *mut usize, count: usize, flags: c_ulonglong, stream: CUstream, ptsz: bool) -> DriverResult {
    let client = client()?;
    check_batch_stream(client, stream, ptsz)?;
    if flags != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's arrays, per the driver API's contract.
    let ranges = unsafe { batch_ranges(dptrs, sizes, count) }?;
    check_batch(client, &ranges)
}

per_thread_twins! {
    cuMemDiscardBatchAsync, cuMemDiscardBatchAsync_ptsz
        (
            dptrs: *mut CUdeviceptr,
            sizes: *mut usize,
            count: usize,
            flags: c_ulonglong,
            h_stream: CUstream,
        )
        |per_thread| run(|| discard(dptrs, sizes, count, flags, h_stream, per_thread))
}

/// The batches that prefetch to locations, which take the same parameters; a discard before a
/// prefetch is a prefetch here (see `discard`).
macro_rules! batch_to_locations {
    ($($name:ident, $name_pt:ident;)*) => {$(
        per_thread_twins! {
            $name, $name_pt
                (
                    dptrs: *mut CUdeviceptr,
                    sizes: *mut usize,
                    count: usize,
                    prefetch_locs: *mut CUmemLocation,
                    prefetch_loc_idxs: *mut usize,
                    num_prefetch_locs: usize,
                    flags: c_ulonglong,
                    h_stream: CUstream,
                )
                |per_thread| {
                    // SAFETY: the caller's arrays, per the driver API's contract.
                    run(|| unsafe {
                        prefetch_batch(dptrs, sizes, count, prefetch_locs, prefetch_loc_idxs, num_prefetch_locs, flags, h_stream, per_thread)
                    })
                }
        }
    )*};
}

batch_to_locations! {
    cuMemPrefetchBatchAsync, cuMemPrefetchBatchAsync_ptsz;
    cuMemDiscardAndPrefetchBatchAsync, cuMemDiscardAndPrefetchBatchAsync_ptsz;
}

fn advise(ptr: CUdeviceptr, count: usize, advice: CUmem_advise, to: Location) -> DriverResult {
    let client = client()?;
    client.managed().advise(client, ptr, count as u64, advice, to).map_err(driver_error)
}

pub unsafe fn cuMemAdvise(dev_ptr: CUdeviceptr, count: usize, advice: CUmem_advise, device: CUdevice) -> CUresult {
    run(|| advise(dev_ptr, count, advice, Location::from_legacy(device)))
}

pub unsafe fn cuMemAdvise_v2(dev_ptr: CUdeviceptr, count: usize, advice: CUmem_advise, to: CUmemLocation) -> CUresult {
    run(|| advise(dev_ptr, count, advice, location(to)))
}

/// Writes one range attribute into `data` (`size` bytes): an int, or for `ACCESSED_BY` as many
/// ints as fit, the locations advised then `CU_DEVICE_INVALID`.
///
/// # Safety
/// `data` is non-NULL and writable for `size` bytes.
unsafe fn write_range_attribute(
    data: *mut c_void,
    size: usize,
    attribute: CUmem_range_attribute,
    ptr: CUdeviceptr,
    count: usize,
) -> DriverResult {
    let client = client()?;
    let value = client.managed().range_attribute(client, ptr, count as u64, attribute).map_err(driver_error)?;
    let ints = data.cast::<c_int>();
    match value {
        RangeValue::Int(value) if size == size_of::<c_int>() => {
            // SAFETY: `data` holds one int, per this function's contract.
            unsafe { write_out(ints, value) }
        }
        RangeValue::Locations(locations) if size > 0 && size.is_multiple_of(size_of::<c_int>()) => {
            for index in 0..size / size_of::<c_int>() {
                let value = locations.get(index).map_or(DEVICE_INVALID, |location| location.legacy());
                // SAFETY: `index` is below the number of ints `data` holds.
                unsafe { ints.add(index).write_unaligned(value) };
            }
            Ok(())
        }
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

pub unsafe fn cuMemRangeGetAttribute(
    data: *mut c_void,
    data_size: usize,
    attribute: CUmem_range_attribute,
    dev_ptr: CUdeviceptr,
    count: usize,
) -> CUresult {
    run(|| {
        non_null([data.cast()])?;
        // SAFETY: checked non-NULL; `data_size` bytes, per the driver API's contract.
        unsafe { write_range_attribute(data, data_size, attribute, dev_ptr, count) }
    })
}

pub unsafe fn cuMemRangeGetAttributes(
    data: *mut *mut c_void,
    data_sizes: *mut usize,
    attributes: *mut CUmem_range_attribute,
    num_attributes: usize,
    dev_ptr: CUdeviceptr,
    count: usize,
) -> CUresult {
    run(|| {
        if num_attributes == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        non_null([data.cast(), data_sizes.cast(), attributes.cast()])?;
        for index in 0..num_attributes {
            // SAFETY: the three arrays hold `num_attributes` entries (the driver API's contract).
            let (slot, size, attribute) = unsafe { (*data.add(index), *data_sizes.add(index), *attributes.add(index)) };
            non_null([slot.cast()])?;
            // SAFETY: checked non-NULL; `size` bytes, per the driver API's contract.
            unsafe { write_range_attribute(slot, size, attribute, dev_ptr, count) }?;
        }
        Ok(())
    })
}

/// Attaching managed memory to a stream narrows which work may touch it while the CPU does;
/// here the CPU and the GPU may always share it, so the call is checked and changes nothing.
fn attach(stream: CUstream, ptr: CUdeviceptr, length: usize, flags: c_uint, ptsz: bool) -> DriverResult {
    let client = client()?;
    resolve_stream(client, stream, ptsz)?;
    let legacy = super::session::is_legacy_stream(client, stream, ptsz)?;
    if ![ATTACH_GLOBAL, ATTACH_HOST, ATTACH_SINGLE].contains(&flags) || (flags == ATTACH_SINGLE && legacy) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // The whole allocation: its start with length 0 or its size.
    let (start, len) = client.managed().check(ptr, 1).map_err(driver_error)?;
    if start != ptr || (length != 0 && length as u64 != len) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

per_thread_twins! {
    cuStreamAttachMemAsync, cuStreamAttachMemAsync_ptsz (h_stream: CUstream, dptr: CUdeviceptr, length: usize, flags: c_uint)
        |per_thread| run(|| attach(h_stream, dptr, length, flags, per_thread))
}
