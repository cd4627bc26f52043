//! JIT linking: `cuLinkCreate`, `cuLinkAddData`/`AddFile`, `cuLinkComplete`, `cuLinkDestroy`. The
//! linker runs on the server (`flyt-client`'s `link.rs`); here are the app's side of it: its
//! option arrays (the code-shaping options are forwarded; its log buffers, their sizes and the wall
//! time are written back as the driver does), the handle it holds, and the linked cubin, which
//! stays valid until `cuLinkDestroy`.

#![allow(clippy::too_many_arguments, reason = "the driver API's signatures")]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_void};
use std::sync::{LazyLock, Mutex};

use flyt_client::link;
use flyt_protocol::ops::{JitOption, LinkOutcome};

use super::module::{app_path, file_error};
use super::session::{client, driver_error, run};
use crate::CUresult;
use crate::ffi::{DriverResult, non_null, write_out};
use crate::generated::types::{CUjit_option, CUjitInputType, CUlinkState};

/// Link handles are this plus the link's id, so a stray pointer is refused, never dereferenced.
const LINK_BASE: usize = 0x6c69_0000_0000;

/// Where the driver writes a result back: a slot of the app's `optionValues` array.
#[derive(Clone, Copy)]
struct Slot(*mut *mut c_void);

/// A log buffer of the app's and the slot its filled size goes to.
#[derive(Clone, Copy)]
struct Log {
    buffer: *mut c_char,
    size: usize,
    size_slot: Option<Slot>,
}

/// The JIT options of one call, sorted: forwarded to the server, or answered here. Module loads
/// (`cuModuleLoadDataEx`, `cuLibraryLoadData`) read theirs the same way.
#[derive(Default)]
pub(super) struct Options {
    pub(super) forwarded: Vec<JitOption>,
    info_log: Option<Log>,
    error_log: Option<Log>,
    wall_time: Option<Slot>,
}

impl Options {
    /// Reads the app's option arrays; an option no end can take (a host pointer, a result written
    /// into its slot) is refused with one line saying it is not supported `through` what.
    ///
    /// # Safety
    /// `options` and `values` are NULL or arrays of `count` entries, as the driver API requires;
    /// a log buffer is writable for the size given beside it.
    pub(super) unsafe fn parse(options: *mut CUjit_option, values: *mut *mut c_void, count: c_uint, through: &str) -> DriverResult<Self> {
        let mut parsed = Self::default();
        if count == 0 {
            return Ok(parsed);
        }
        non_null([options.cast(), values.cast()])?;
        let (mut info, mut error) = (
            Log { buffer: std::ptr::null_mut(), size: 0, size_slot: None },
            Log { buffer: std::ptr::null_mut(), size: 0, size_slot: None },
        );
        for index in 0..count as usize {
            // SAFETY: both arrays have `count` entries (the caller's contract).
            let (option, slot) = unsafe { (*options.add(index), values.add(index)) };
            // SAFETY: as above; the slot holds the option's value.
            let value = unsafe { *slot } as usize;
            match option {
                JitOption::WALL_TIME => parsed.wall_time = Some(Slot(slot)),
                JitOption::INFO_LOG_BUFFER => info.buffer = value as *mut c_char,
                JitOption::INFO_LOG_BUFFER_SIZE_BYTES => (info.size, info.size_slot) = (value, Some(Slot(slot))),
                JitOption::ERROR_LOG_BUFFER => error.buffer = value as *mut c_char,
                JitOption::ERROR_LOG_BUFFER_SIZE_BYTES => (error.size, error.size_slot) = (value, Some(Slot(slot))),
                // The server compiles for its own context's device.
                JitOption::TARGET_FROM_CUCONTEXT => {}
                other if JitOption::FORWARDED.contains(&other) => {
                    parsed.forwarded.push(JitOption { option: other, value: value as u64 });
                }
                other => return Err(refuse_option(other, through)),
            }
        }
        parsed.info_log = (!info.buffer.is_null() && info.size > 0).then_some(info);
        parsed.error_log = (!error.buffer.is_null() && error.size > 0).then_some(error);
        Ok(parsed)
    }

    /// Writes a step's logs and wall time where the app asked for them.
    pub(super) fn report(&self, outcome: &LinkOutcome) {
        for (log, text) in [(self.info_log, &outcome.info_log), (self.error_log, &outcome.error_log)] {
            let Some(log) = log else { continue };
            let len = text.len().min(log.size - 1);
            // SAFETY: the app's log buffer holds `log.size` bytes (checked non-zero), and the
            // driver API requires it to stay valid for the link's life.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), log.buffer, len);
                *log.buffer.add(len) = 0;
            }
            if let Some(Slot(slot)) = log.size_slot {
                // SAFETY: the app's option value slot, writable as the driver API documents
                // ("OUT: amount of log buffer filled").
                unsafe { *slot = std::ptr::without_provenance_mut(len) };
            }
        }
        if let Some(Slot(slot)) = self.wall_time {
            // SAFETY: the slot of CU_JIT_WALL_TIME, where the driver writes a float.
            unsafe { slot.cast::<f32>().write_unaligned(outcome.wall_time_ms) };
        }
    }
}

/// An option Flyt cannot take, named once.
pub(super) fn refuse_option(option: CUjit_option, through: &str) -> CUresult {
    crate::diagnostics::once(
        &format!("jit-option-{option}-{through}"),
        &format!("flyt: JIT option {option} is not supported through {through} (returning CUDA_ERROR_NOT_SUPPORTED)"),
    );
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// A link the app holds.
struct Link {
    id: u64,
    /// The options given at creation: their logs and wall time are written at every step.
    options: Options,
    /// The linked image, valid until `cuLinkDestroy`.
    cubin: Option<Box<[u8]>>,
}

// SAFETY: the raw pointers are the app's log buffers and option slots, which the driver API
// makes the app keep valid for the link's life; they are written only inside cuLink* calls.
unsafe impl Send for Link {}

/// What refused link options are said not to be supported through.
const LINKER: &str = "Flyt's linker";

static LINKS: LazyLock<Mutex<HashMap<usize, Link>>> = LazyLock::new(Mutex::default);

fn links() -> std::sync::MutexGuard<'static, HashMap<usize, Link>> {
    LINKS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `body` on the link behind `state`.
fn with_link<T>(state: CUlinkState, body: impl FnOnce(&mut Link) -> DriverResult<T>) -> DriverResult<T> {
    let mut links = links();
    let link = links.get_mut(&(state as usize)).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    body(link)
}

pub unsafe fn cuLinkCreate_v2(
    num_options: c_uint,
    options: *mut CUjit_option,
    option_values: *mut *mut c_void,
    state_out: *mut CUlinkState,
) -> CUresult {
    run(|| {
        non_null([state_out.cast()])?;
        // SAFETY: the caller's option arrays, per the driver API.
        let options = unsafe { Options::parse(options, option_values, num_options, LINKER) }?;
        let client = client()?;
        let log_size = |log: Option<Log>| log.map_or(0, |log| u32::try_from(log.size).unwrap_or(u32::MAX));
        let id = link::create(client, options.forwarded.clone(), log_size(options.info_log), log_size(options.error_log))
            .map_err(driver_error)?;
        let handle = LINK_BASE + id as usize;
        links().insert(handle, Link { id, options, cubin: None });
        // SAFETY: checked non-NULL; the caller's out-pointer.
        unsafe { write_out(state_out, std::ptr::without_provenance_mut(handle)) }
    })
}

/// Sends one input and reports the driver's verdict through the link's logs.
fn add(state: CUlinkState, kind: CUjitInputType, data: &[u8], name: String, options: Options) -> DriverResult {
    let client = client()?;
    let id = with_link(state, |link| if link.cubin.is_some() { Err(CUresult::CUDA_ERROR_INVALID_VALUE) } else { Ok(link.id) })?;
    let outcome = link::add(client, id, kind, name, data, options.forwarded.clone()).map_err(driver_error)?;
    with_link(state, |link| {
        link.options.report(&outcome);
        Ok(())
    })?;
    options.report(&outcome);
    outcome.error.map_or(Ok(()), |error| Err(driver_error(error)))
}

/// The name an input is given in the linker's messages.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
unsafe fn input_name(name: *const c_char) -> String {
    if name.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

pub unsafe fn cuLinkAddData_v2(
    state: CUlinkState,
    type_: CUjitInputType,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    num_options: c_uint,
    options: *mut CUjit_option,
    option_values: *mut *mut c_void,
) -> CUresult {
    run(|| {
        if data.is_null() || size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's option arrays, per the driver API.
        let options = unsafe { Options::parse(options, option_values, num_options, LINKER) }?;
        // SAFETY: `data` holds `size` bytes, per the driver API; they are copied out at once.
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) };
        // SAFETY: NULL or a C string, per the driver API.
        add(state, type_, bytes, unsafe { input_name(name) }, options)
    })
}

pub unsafe fn cuLinkAddFile_v2(
    state: CUlinkState,
    type_: CUjitInputType,
    path: *const c_char,
    num_options: c_uint,
    options: *mut CUjit_option,
    option_values: *mut *mut c_void,
) -> CUresult {
    run(|| {
        let file = app_path(path)?;
        // SAFETY: the caller's option arrays, per the driver API.
        let options = unsafe { Options::parse(options, option_values, num_options, LINKER) }?;
        let mut bytes = std::fs::read(file).map_err(file_error)?;
        if type_ == JIT_INPUT_PTX && bytes.last() != Some(&0) {
            bytes.push(0);
        }
        add(state, type_, &bytes, file.to_string_lossy().into_owned(), options)
    })
}

/// `CU_JIT_INPUT_PTX`: text the driver reads up to its NUL.
const JIT_INPUT_PTX: CUjitInputType = 1;

pub unsafe fn cuLinkComplete(state: CUlinkState, cubin_out: *mut *mut c_void, size_out: *mut usize) -> CUresult {
    run(|| {
        non_null([cubin_out.cast(), size_out.cast()])?;
        let client = client()?;
        let id = with_link(state, |link| Ok(link.id))?;
        let (outcome, cubin) = link::complete(client, id).map_err(driver_error)?;
        with_link(state, |link| {
            link.options.report(&outcome);
            if let Some(error) = outcome.error {
                return Err(driver_error(error));
            }
            let cubin = link.cubin.insert(cubin.into_boxed_slice());
            // SAFETY: both checked non-NULL; the caller's out-pointers. The cubin stays in the
            // link until cuLinkDestroy, as the driver API promises.
            unsafe {
                *cubin_out = cubin.as_mut_ptr().cast();
                *size_out = cubin.len();
            }
            Ok(())
        })
    })
}

pub unsafe fn cuLinkDestroy(state: CUlinkState) -> CUresult {
    run(|| {
        let link = links().remove(&(state as usize)).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        match flyt_client::client::existing_client() {
            Some(client) => link::destroy(client, link.id).map_err(driver_error),
            None => Ok(()),
        }
    })
}

// The CUDA 5.x-6.0 entry points, the same calls as `_v2` (programs built then name them): the
// exports of those names call these functions.
pub use {cuLinkAddData_v2 as cuLinkAddData, cuLinkAddFile_v2 as cuLinkAddFile, cuLinkCreate_v2 as cuLinkCreate};
