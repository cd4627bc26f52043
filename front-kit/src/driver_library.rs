//! Finding the driver library a front runs over: Flyt's `libcuda.so.1` in the front's own folder
//! (Flyt's library folder holds all of Flyt's libraries), else whichever `libcuda.so.1` the library
//! path finds, as NVIDIA's runtime and NVML load theirs.

use std::ffi::c_void;
use std::path::{Path, PathBuf};

/// Opens the driver library.
pub fn open() -> Result<libloading::Library, String> {
    if let Some(beside) = own_folder().map(|folder| folder.join("libcuda.so.1"))
        && beside.exists()
    {
        // SAFETY: loading Flyt's driver library runs no initializers that need anything of ours.
        return unsafe { libloading::Library::new(&beside) }.map_err(|error| format!("{}: {error}", beside.display()));
    }
    // SAFETY: as above; by name, as NVIDIA's libraries load their driver.
    unsafe { libloading::Library::new("libcuda.so.1") }.map_err(|error| error.to_string())
}

/// The folder of the shared library this code was linked into.
pub fn own_folder() -> Option<PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let own_address = own_folder as *const c_void;
    // SAFETY: `dladdr` fills `info` for an address inside a loaded object; ours is a function of
    // the library that linked this crate.
    if unsafe { libc::dladdr(own_address, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: `dladdr` succeeded, so `info` is initialized.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is the loader's NUL-terminated path of the object.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()));
    path.parent().map(Path::to_path_buf)
}
