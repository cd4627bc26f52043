//! Links `libcuda.so.1` the way programs and NVIDIA's libraries expect to `dlopen` it: soname `libcuda.so.1`
//! and no symbol versions (the real driver's exports have none). The file cargo builds is
//! `libflyt_libcuda.so`, not `libcuda.so`: cargo puts its target directories on the library path of what it
//! runs, and the rpc-server's driver loader (cudarc) tries `libcuda.so` first, so a build output of that name
//! would replace NVIDIA's driver in the server. Installing it as `libcuda.so.1` is the packaging's job.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
