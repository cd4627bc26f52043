//! Writes a VM guest's initramfs, as the VM guest tests make theirs, for runs elsewhere (the GPU
//! machine's guest benchmark, `benchmarks/vm-guest-gpu.sh`):
//!
//!   flyt-guest-image --kernel DIR --libs DIR --init FILE --out FILE PROGRAM...
//!
//! `--kernel` is what `.ci/fetch-guest-kernel` made; `--libs` holds Flyt's `libcuda.so.1` the
//! programs link against; `--init` is the shell the guest runs after its prelude (mounts,
//! modules, `port NAME`).

use std::path::PathBuf;

use flyt_test_support::guest::{GuestKernel, write_image};

const USAGE: &str = "usage: flyt-guest-image --kernel DIR --libs DIR --init FILE --out FILE PROGRAM...";

fn fail(reason: &str) -> ! {
    eprintln!("flyt-guest-image: {reason}\n{USAGE}");
    std::process::exit(2)
}

fn main() {
    let (mut kernel, mut libs, mut init, mut out, mut programs) = (None, None, None, None, Vec::new());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().map(PathBuf::from).unwrap_or_else(|| fail(&format!("{arg} needs a value")));
        match arg.as_str() {
            "--kernel" => kernel = Some(value()),
            "--libs" => libs = Some(value()),
            "--init" => init = Some(value()),
            "--out" => out = Some(value()),
            flag if flag.starts_with('-') => fail(&format!("unknown option {flag}")),
            program => programs.push(PathBuf::from(program)),
        }
    }
    let (Some(kernel), Some(libs), Some(init), Some(out)) = (kernel, libs, init, out) else {
        fail("--kernel, --libs, --init and --out are needed")
    };
    let body = std::fs::read_to_string(&init).unwrap_or_else(|error| fail(&format!("{}: {error}", init.display())));
    let scratch = std::env::temp_dir().join(format!("flyt-guest-image-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    write_image(&GuestKernel::at(&kernel), &scratch, &programs, &libs, &body, &out);
    let _ = std::fs::remove_dir_all(&scratch);
    println!("{}", out.display());
}
