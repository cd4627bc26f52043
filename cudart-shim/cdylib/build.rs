//! Links `libcudart.so.13` the way apps built with `nvcc -cudart=shared` expect: soname
//! `libcudart.so.13` and a version node `libcudart.so.13` that each export is bound to (with
//! `.symver`, in `flyt-cudart`'s export table).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    println!("cargo:rerun-if-changed=libcudart.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libcudart.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcudart.so.13");
}
