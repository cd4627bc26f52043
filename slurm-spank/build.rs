//! A SPANK plugin loads only into the Slurm release (major.minor) it was built for: its
//! `plugin_version` comes from FLYT_SLURM_VERSION (`22.05`), else from the installed
//! `slurm/slurm_version.h`, else 22.05 (Debian 12's).

fn main() {
    println!("cargo:rerun-if-env-changed=FLYT_SLURM_VERSION");
    println!("cargo:rerun-if-changed=/usr/include/slurm/slurm_version.h");
    let number = std::env::var("FLYT_SLURM_VERSION")
        .ok()
        .and_then(|version| {
            let mut parts = version.trim().split('.').map(|part| part.parse::<u32>().ok());
            let (major, minor) = (parts.next()??, parts.next()??);
            Some((major << 16) | (minor << 8))
        })
        .or_else(|| {
            let header = std::fs::read_to_string("/usr/include/slurm/slurm_version.h").ok()?;
            header.lines().find_map(|line| {
                let value = line.strip_prefix("#define SLURM_VERSION_NUMBER")?.trim();
                u32::from_str_radix(value.trim_start_matches("0x"), 16).ok()
            })
        })
        .unwrap_or((22 << 16) | (5 << 8));
    println!("cargo:rustc-env=FLYT_SLURM_VERSION_NUMBER={number}");
}
