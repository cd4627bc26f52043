//! Links `libcuda.so.1` the way programs and NVIDIA's libraries expect to `dlopen` it: soname `libcuda.so.1`
//! and no symbol versions (the real driver's exports have none).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
