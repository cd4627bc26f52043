//! `cuLogs*`: the driver's error log, kept in the process (`crate::logs`).

use std::ffi::{CStr, c_char, c_uint};

use crate::CUresult;
use crate::ffi::{DriverResult, finish, non_null, write_out};
use crate::generated::types::{CUlogIterator, CUlogsCallback, CUlogsCallbackHandle};

fn no_flags(flags: c_uint) -> DriverResult {
    if flags == 0 { Ok(()) } else { Err(CUresult::CUDA_ERROR_INVALID_VALUE) }
}

pub unsafe fn cuLogsRegisterCallback(
    callback_func: CUlogsCallback,
    user_data: *mut std::ffi::c_void,
    callback_out: *mut CUlogsCallbackHandle,
) -> CUresult {
    finish((|| {
        let callback = callback_func.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let id = crate::logs::register(callback, user_data);
        if !callback_out.is_null() {
            // SAFETY: non-NULL; the caller's optional out-pointer. The handle is the registration's
            // number, never dereferenced.
            unsafe { callback_out.write(id as CUlogsCallbackHandle) };
        }
        Ok(())
    })())
}

pub unsafe fn cuLogsUnregisterCallback(callback: CUlogsCallbackHandle) -> CUresult {
    finish(if crate::logs::unregister(callback as usize) { Ok(()) } else { Err(CUresult::CUDA_ERROR_INVALID_VALUE) })
}

pub unsafe fn cuLogsCurrent(iterator_out: *mut CUlogIterator, flags: c_uint) -> CUresult {
    finish((|| {
        no_flags(flags)?;
        // SAFETY: the caller's out-pointer (NULL is refused).
        unsafe { write_out(iterator_out, crate::logs::current()) }
    })())
}

/// The messages from the iterator (all for NULL), advancing it.
///
/// # Safety
/// `iterator` is NULL or the caller's readable and writable iterator.
unsafe fn dump(iterator: *mut CUlogIterator, limit: usize) -> Option<String> {
    // SAFETY: per this function's contract.
    let from = (!iterator.is_null()).then(|| unsafe { iterator.read() });
    let (text, next) = crate::logs::dump(from, limit)?;
    if !iterator.is_null() {
        // SAFETY: as above.
        unsafe { iterator.write(next) };
    }
    Some(text)
}

pub unsafe fn cuLogsDumpToFile(iterator: *mut CUlogIterator, path_to_file: *const c_char, flags: c_uint) -> CUresult {
    finish((|| {
        no_flags(flags)?;
        non_null([path_to_file.cast()])?;
        // SAFETY: checked non-NULL; the caller's C string.
        let path = unsafe { CStr::from_ptr(path_to_file) }.to_str().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller's iterator or NULL.
        let text = unsafe { dump(iterator, usize::MAX) }.unwrap_or_default();
        std::fs::write(path, text).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)
    })())
}

pub unsafe fn cuLogsDumpToMemory(iterator: *mut CUlogIterator, buffer: *mut c_char, size: *mut usize, flags: c_uint) -> CUresult {
    finish((|| {
        no_flags(flags)?;
        non_null([buffer.cast(), size.cast()])?;
        // SAFETY: checked non-NULL; the caller's size.
        let capacity = unsafe { size.read() };
        // One byte stays for the terminating NUL.
        // SAFETY: the caller's iterator or NULL.
        let Some(text) = (unsafe { dump(iterator, capacity.saturating_sub(1)) }) else {
            // SAFETY: checked non-NULL.
            unsafe { size.write(0) };
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        if capacity == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `buffer` holds `capacity` bytes (the caller's contract) and the text is at most
        // `capacity - 1` long.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), text.len());
            buffer.add(text.len()).write(0);
            size.write(text.len());
        }
        Ok(())
    })())
}
