//! Initialisation, versions, error strings, `cuGetProcAddress` and `cuGetExportTable`.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::CUresult;
use crate::driver::driver;
use crate::ffi::{finish, write_out};
use crate::generated::errors::ERRORS;
use crate::generated::types::{CUdriverProcAddressQueryResult, CUuuid, cuuint64_t};
use crate::proc_address::{Resolution, SYMBOL_SUCCESS, resolve};

pub unsafe fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    finish(driver().init())
}

pub unsafe fn cuDriverGetVersion(driver_version: *mut c_int) -> CUresult {
    // SAFETY: the caller passes NULL or a writable int.
    finish(unsafe { write_out(driver_version, driver().driver_version()) })
}

fn error_entry(error: CUresult) -> Option<&'static (u32, &'static CStr, &'static CStr)> {
    ERRORS.binary_search_by_key(&error.0, |e| e.0).ok().map(|i| &ERRORS[i])
}

/// The driver's name of a code (`CUDA_ERROR_...`), or its number for a code the driver does not name.
pub fn error_name(error: CUresult) -> String {
    error_entry(error).map_or_else(|| format!("CUresult {}", error.0), |entry| entry.1.to_string_lossy().into_owned())
}

/// Unknown codes: CUDA_ERROR_INVALID_VALUE with `*p_str` set to NULL, as the driver does.
unsafe fn error_text(error: CUresult, p_str: *mut *const c_char, name: bool) -> CUresult {
    let (text, result) = match error_entry(error) {
        Some(&(_, error_name, error_text)) => (if name { error_name } else { error_text }.as_ptr(), CUresult::CUDA_SUCCESS),
        None => (std::ptr::null(), CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: the caller passes NULL or a writable pointer.
    match unsafe { write_out(p_str, text) } {
        Ok(()) => result,
        Err(code) => code,
    }
}

pub unsafe fn cuGetErrorString(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { error_text(error, p_str, false) }
}

pub unsafe fn cuGetErrorName(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    // SAFETY: forwarded contract.
    unsafe { error_text(error, p_str, true) }
}

/// The name's bytes, or None for NULL.
///
/// # Safety
/// `symbol` is NULL or a NUL-terminated string.
unsafe fn symbol_name<'a>(symbol: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: non-NULL and NUL-terminated per the contract.
    (!symbol.is_null()).then(|| unsafe { CStr::from_ptr(symbol) }.to_bytes())
}

/// The 4-argument `cuGetProcAddress` of CUDA 11.3 (still the ELF symbol of that name): a name that is
/// unknown or too new for the version answers CUDA_ERROR_NOT_FOUND and leaves `*pfn` alone.
pub unsafe fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t) -> CUresult {
    // SAFETY: the caller passes NULL or a NUL-terminated name.
    let Some(name) = (unsafe { symbol_name(symbol) }) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    if pfn.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    match resolve(name, cuda_version, flags, driver().driver_version()) {
        Resolution::Found(address) => {
            // SAFETY: checked non-NULL above; the caller passes a writable pointer.
            unsafe { pfn.write(address.cast_mut()) };
            CUresult::CUDA_SUCCESS
        }
        Resolution::Missing(_) => CUresult::CUDA_ERROR_NOT_FOUND,
        Resolution::Error(code) => code,
    }
}

/// `cuGetProcAddress_v2`: a name that is unknown or too new for the version is CUDA_SUCCESS with
/// `*pfn = NULL` and the reason in `*symbol_status` (which may be NULL).
pub unsafe fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    symbol_status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    // SAFETY: the caller passes NULL or a NUL-terminated name.
    let Some(name) = (unsafe { symbol_name(symbol) }) else {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    };
    if pfn.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let (address, status) = match resolve(name, cuda_version, flags, driver().driver_version()) {
        Resolution::Found(address) => (address.cast_mut(), SYMBOL_SUCCESS),
        Resolution::Missing(status) => (std::ptr::null_mut(), status),
        Resolution::Error(code) => return code,
    };
    // SAFETY: checked non-NULL above; the caller passes a writable pointer.
    unsafe { pfn.write(address) };
    if !symbol_status.is_null() {
        // SAFETY: non-NULL; the caller passes a writable status when it passes one.
        unsafe { symbol_status.write(status) };
    }
    CUresult::CUDA_SUCCESS
}

pub unsafe fn cuGetExportTable(pp_export_table: *mut *const c_void, p_export_table_id: *const CUuuid) -> CUresult {
    if pp_export_table.is_null() || p_export_table_id.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-NULL; the caller passes a readable 16-byte UUID.
    let id = unsafe { (*p_export_table_id).bytes };
    let id: [u8; 16] = id.map(|b| b as u8);
    match crate::export_tables::find(&id) {
        Some(table) => {
            // SAFETY: non-NULL; the caller passes a writable pointer.
            unsafe { pp_export_table.write(table) };
            CUresult::CUDA_SUCCESS
        }
        None => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_and_strings() {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: `text` is a writable pointer.
        unsafe {
            assert_eq!(cuGetErrorName(CUresult::CUDA_ERROR_NOT_SUPPORTED, &mut text), CUresult::CUDA_SUCCESS);
            assert_eq!(CStr::from_ptr(text).to_str().unwrap(), "CUDA_ERROR_NOT_SUPPORTED");
            assert_eq!(cuGetErrorString(CUresult::CUDA_ERROR_NOT_INITIALIZED, &mut text), CUresult::CUDA_SUCCESS);
            assert_eq!(CStr::from_ptr(text).to_str().unwrap(), "initialization error");
            assert_eq!(cuGetErrorString(CUresult(123_456), &mut text), CUresult::CUDA_ERROR_INVALID_VALUE);
            assert!(text.is_null());
            assert_eq!(cuGetErrorName(CUresult(0), std::ptr::null_mut()), CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        assert!(ERRORS.len() > 100);
        assert!(ERRORS.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn proc_address_v1_and_v2_report_missing_names_differently() {
        let mut pfn: *mut c_void = std::ptr::dangling_mut();
        let mut status: CUdriverProcAddressQueryResult = 99;
        // SAFETY: valid name and writable out-pointers.
        unsafe {
            assert_eq!(cuGetProcAddress_v2(c"".as_ptr(), &mut pfn, 0, 0, &mut status), CUresult::CUDA_SUCCESS);
            assert!(pfn.is_null());
            assert_eq!(status, crate::proc_address::SYMBOL_NOT_FOUND);
            let result = cuGetProcAddress_v2(c"cuCtxCreate".as_ptr(), &mut pfn, 1000, 0, &mut status);
            assert_eq!((result, status), (CUresult::CUDA_SUCCESS, crate::proc_address::VERSION_NOT_SUFFICIENT));
            let result = cuGetProcAddress_v2(c"cuInit".as_ptr(), &mut pfn, 2000, 0, std::ptr::null_mut());
            assert_eq!(result, CUresult::CUDA_SUCCESS);
            assert_eq!(crate::proc_address::export_name(pfn), Some("cuInit"));

            let mut untouched: *mut c_void = 7usize as *mut c_void;
            assert_eq!(cuGetProcAddress(c"cuNoSuch".as_ptr(), &mut untouched, 12000, 0), CUresult::CUDA_ERROR_NOT_FOUND);
            assert_eq!(cuGetProcAddress(c"cuCtxCreate".as_ptr(), &mut untouched, 1000, 0), CUresult::CUDA_ERROR_NOT_FOUND);
            assert_eq!(untouched as usize, 7);
            assert_eq!(cuGetProcAddress(c"cuMemAlloc".as_ptr(), &mut untouched, 99000, 0), CUresult::CUDA_ERROR_INVALID_VALUE);
            assert_eq!(untouched as usize, 7);
        }
    }

    #[test]
    fn unknown_export_table_is_invalid_value() {
        let mut table: *const c_void = std::ptr::null();
        let heap_access = CUuuid {
            bytes: [0x19, 0x5b, 0xcb, 0xf4, 0xd6, 0x7d, 0x02, 0x4a, 0xac, 0xc5, 0x1d, 0x29, 0xce, 0xa6, 0x31, 0xae]
                .map(|b: u8| b as c_char),
        };
        // SAFETY: valid pointers.
        let result = unsafe { cuGetExportTable(&mut table, &heap_access) };
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE);
        assert!(table.is_null());
    }
}
