//! Links `libnvidia-ml.so.1` with the soname programs load NVML by.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
