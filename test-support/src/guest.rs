//! Virtual machines for tests: QEMU, under TCG (no KVM needed), boots a Linux kernel whose
//! initramfs holds busybox, the programs the test runs in the guest and every library they load.
//! The guest's `/init` is the test's shell script; what it prints reaches the test through the
//! guest's serial console. `.ci/fetch-guest-kernel` provides the kernel and its virtio modules
//! (`FLYT_GUEST_KERNEL`) and installs QEMU and a static busybox.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the guest finds Flyt's libraries (its `LD_LIBRARY_PATH`).
pub const GUEST_LIB_DIR: &str = "/opt/flyt/lib";
/// Where the guest finds the test's programs.
pub const GUEST_BIN_DIR: &str = "/opt/flyt/bin";

/// The kernel a guest boots and the modules `/init` loads, in order (the virtio PCI transport
/// and virtio-serial ports, which Debian's cloud kernel builds as modules).
pub struct GuestKernel {
    pub vmlinuz: PathBuf,
    pub modules: Vec<PathBuf>,
    /// The package and version the kernel came from (`kernel.txt`), shown with every console
    /// so a guest that fails to boot after Debian changed its kernel says which one it was.
    pub description: String,
}

impl GuestKernel {
    /// The kernel named by `FLYT_GUEST_KERNEL` (a folder with `vmlinuz`, `modules/` and
    /// `modules.order`), or `None` with a line saying the test is skipped.
    pub fn from_env() -> Option<Self> {
        let Some(dir) = std::env::var_os("FLYT_GUEST_KERNEL").map(PathBuf::from) else {
            eprintln!("skipped: FLYT_GUEST_KERNEL is not set (tools/test sets it with .ci/fetch-guest-kernel)");
            return None;
        };
        Some(Self::at(&dir))
    }

    /// The kernel in `dir`, laid out as `.ci/fetch-guest-kernel` leaves it.
    pub fn at(dir: &Path) -> Self {
        let vmlinuz = dir.join("vmlinuz");
        assert!(vmlinuz.exists(), "FLYT_GUEST_KERNEL={} has no vmlinuz: run .ci/fetch-guest-kernel", dir.display());
        let order = std::fs::read_to_string(dir.join("modules.order")).unwrap_or_default();
        let modules = order.lines().filter(|line| !line.is_empty()).map(|name| dir.join("modules").join(name)).collect();
        let description = std::fs::read_to_string(dir.join("kernel.txt"))
            .map(|text| text.trim().to_string())
            .unwrap_or_else(|_| "unknown (no kernel.txt: fetched before .ci/fetch-guest-kernel recorded it)".into());
        let names: Vec<&str> = order.lines().filter(|line| !line.is_empty()).collect();
        let description = format!("{description}; modules loaded in order: {}", names.join(" "));
        Self { vmlinuz, modules, description }
    }
}

enum Entry {
    Dir,
    File { bytes: Vec<u8>, mode: u32 },
    Symlink(String),
    CharDevice { major: u32, minor: u32 },
}

/// An initramfs being put together: paths in the guest to their contents.
pub struct Initramfs {
    entries: BTreeMap<String, Entry>,
    scratch: PathBuf,
}

impl Initramfs {
    /// Busybox (with the applets `/init` scripts use) and the kernel's modules.
    pub fn new(kernel: &GuestKernel, scratch: &Path) -> Self {
        let mut image = Self { entries: BTreeMap::new(), scratch: scratch.to_path_buf() };
        for dir in ["/dev", "/proc", "/sys", "/tmp", "/lib/modules", GUEST_LIB_DIR, GUEST_BIN_DIR] {
            image.dir(dir);
        }
        image.entries.insert("dev/console".into(), Entry::CharDevice { major: 5, minor: 1 });
        let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().map(Path::new).find(|path| path.exists());
        let busybox = busybox.expect("busybox is needed for the guest (Debian: busybox-static; .ci/fetch-guest-kernel installs it)");
        image.add_program(busybox, "/bin/busybox", None);
        for applet in ["sh", "mount", "insmod", "cat", "echo", "poweroff", "sleep", "timeout", "kill", "ls", "ip"] {
            image.entries.insert(format!("bin/{applet}"), Entry::Symlink("busybox".into()));
        }
        for module in &kernel.modules {
            let name = module.file_name().expect("a module file").to_string_lossy().into_owned();
            image.add_file(module, &format!("/lib/modules/{name}"), 0o644);
        }
        image
    }

    fn dir(&mut self, path: &str) {
        let mut sofar = String::new();
        for part in path.trim_matches('/').split('/').filter(|part| !part.is_empty()) {
            if !sofar.is_empty() {
                sofar.push('/');
            }
            sofar.push_str(part);
            self.entries.entry(sofar.clone()).or_insert(Entry::Dir);
        }
    }

    fn insert(&mut self, at: &str, entry: Entry) {
        let path = at.trim_start_matches('/');
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dir(parent);
        }
        self.entries.insert(path.to_string(), entry);
    }

    /// A host file at `at` in the guest.
    pub fn add_file(&mut self, host: &Path, at: &str, mode: u32) {
        let bytes = std::fs::read(host).unwrap_or_else(|error| panic!("{}: {error}", host.display()));
        self.insert(at, Entry::File { bytes, mode });
    }

    /// A text file (for example the `/init` script).
    pub fn add_text(&mut self, at: &str, text: &str, mode: u32) {
        self.insert(at, Entry::File { bytes: text.as_bytes().to_vec(), mode });
    }

    /// A program at `at` and every shared library it loads (`ldd`): the system's at their own
    /// paths, those found in `libs` (Flyt's, stripped of debug info) in [`GUEST_LIB_DIR`].
    pub fn add_program(&mut self, host: &Path, at: &str, libs: Option<&Path>) {
        self.add_stripped(host, at, 0o755);
        // Absolute, so ldd names what it finds there by absolute paths too.
        let libs = libs.map(|libs| std::path::absolute(libs).expect("the libraries' folder"));
        let libs = libs.as_deref();
        let mut ldd = Command::new("ldd");
        ldd.arg(host);
        if let Some(libs) = libs {
            ldd.env("LD_LIBRARY_PATH", libs);
        }
        let output = ldd.output().expect("ldd is needed to build a guest image");
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let line = line.trim();
            assert!(!line.contains("not found"), "{}: a library is missing: {line}", host.display());
            // `name => /path (0x...)`, or the loader itself: `/lib64/ld-linux-x86-64.so.2 (0x...)`.
            let path = line.split_once("=> ").map_or(line, |(_, path)| path);
            let Some(path) = path.split_whitespace().next().filter(|path| path.starts_with('/')) else { continue };
            let path = Path::new(path);
            match libs.filter(|libs| path.starts_with(libs)) {
                Some(_) => {
                    let name = path.file_name().expect("a library name").to_string_lossy().into_owned();
                    self.add_stripped(path, &format!("{GUEST_LIB_DIR}/{name}"), 0o755);
                }
                None => self.add_file(path, &path.display().to_string(), 0o755),
            }
        }
    }

    /// A copy without debug info: debug builds of Flyt's library are large, and the guest
    /// unpacks its initramfs into its own memory.
    fn add_stripped(&mut self, host: &Path, at: &str, mode: u32) {
        let name = at.trim_start_matches('/').replace('/', "_");
        let stripped = self.scratch.join(format!("stripped-{name}"));
        let status = Command::new("strip").arg("--strip-debug").arg("-o").arg(&stripped).arg(host).status().expect("strip (binutils)");
        assert!(status.success(), "strip {}", host.display());
        self.add_file(&stripped, at, mode);
        let _ = std::fs::remove_file(&stripped);
    }

    /// Writes the image as an uncompressed `newc` cpio archive, which the kernel unpacks.
    pub fn write(&self, path: &Path) {
        let mut archive = Vec::new();
        let mut append = |name: &str, mode: u32, rdev: (u32, u32), data: &[u8], inode: u32| {
            let size = |len: usize| u32::try_from(len).expect("an initramfs entry under 4 GiB");
            let fields = [inode, mode, 0, 0, 1, 0, size(data.len()), 0, 0, rdev.0, rdev.1, size(name.len() + 1), 0];
            archive.extend_from_slice(b"070701");
            for field in fields {
                archive.extend_from_slice(format!("{field:08X}").as_bytes());
            }
            archive.extend_from_slice(name.as_bytes());
            archive.push(0);
            archive.resize(archive.len().next_multiple_of(4), 0);
            archive.extend_from_slice(data);
            archive.resize(archive.len().next_multiple_of(4), 0);
        };
        for (inode, (name, entry)) in (1..).zip(&self.entries) {
            match entry {
                Entry::Dir => append(name, 0o040_755, (0, 0), &[], inode),
                Entry::File { bytes, mode } => append(name, 0o100_000 | mode, (0, 0), bytes, inode),
                Entry::Symlink(target) => append(name, 0o120_777, (0, 0), target.as_bytes(), inode),
                Entry::CharDevice { major, minor } => append(name, 0o020_600, (*major, *minor), &[], inode),
            }
        }
        append("TRAILER!!!", 0, (0, 0), &[], 0);
        std::fs::write(path, archive).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    }
}

/// The start of every guest's `/init`: the usual mounts, the kernel's modules loaded, and
/// `port NAME`, which prints the device of the virtio-serial port QEMU named `NAME`.
pub fn init_prelude(kernel: &GuestKernel) -> String {
    let mut script = String::from(
        "#!/bin/sh\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sys /sys\n\
         mount -t devtmpfs dev /dev\n",
    );
    for module in &kernel.modules {
        let name = module.file_name().expect("a module file").to_string_lossy().into_owned();
        script.push_str(&format!("insmod /lib/modules/{name}\n"));
    }
    script.push_str(
        "port() {\n\
         \x20 for p in /sys/class/virtio-ports/*; do\n\
         \x20   [ \"$(cat $p/name 2>/dev/null)\" = \"$1\" ] && echo /dev/${p##*/} && return\n\
         \x20 done\n\
         }\n\
         export LD_LIBRARY_PATH=/opt/flyt/lib PATH=/opt/flyt/bin:/bin\n",
    );
    script
}

/// Writes to `out` the initramfs of a guest whose `/init` runs `body` after [`init_prelude`],
/// prints `flyt-guest-done` and powers off; `programs` go to [`GUEST_BIN_DIR`] under their own
/// names, with what they load (Flyt's libraries from `libs`).
pub fn write_image(kernel: &GuestKernel, scratch: &Path, programs: &[PathBuf], libs: &Path, body: &str, out: &Path) {
    let mut image = Initramfs::new(kernel, scratch);
    for program in programs {
        let name = program.file_name().expect("a program file").to_string_lossy().into_owned();
        image.add_program(program, &format!("{GUEST_BIN_DIR}/{name}"), Some(libs));
    }
    let script = format!("{}{body}\necho flyt-guest-done\npoweroff -f\n", init_prelude(kernel));
    image.add_text("/init", &script, 0o755);
    image.write(out);
}

/// A booted guest: QEMU under TCG, its serial console captured.
pub struct Vm {
    child: Child,
    console: Arc<Mutex<String>>,
    /// Which kernel it booted, the console's first line.
    kernel: String,
    /// The threads reading QEMU's output; they end with its pipes.
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Vm {
    /// Boots `kernel` with `initrd` and the QEMU options in `devices` (ivshmem regions, serial
    /// ports). Unless `devices` gives it one (`-nic ...`), the guest has no network card at all:
    /// whatever reaches the host goes through `devices`.
    pub fn boot(kernel: &GuestKernel, initrd: &Path, devices: &[String]) -> Self {
        let mut command = Command::new("qemu-system-x86_64");
        if !devices.iter().any(|option| option == "-nic") {
            command.args(["-nic", "none"]);
        }
        command
            .args(["-accel", "tcg", "-m", "512", "-smp", "2", "-no-reboot"])
            .args(["-display", "none", "-vga", "none", "-monitor", "none", "-serial", "stdio"])
            .arg("-kernel")
            .arg(&kernel.vmlinuz)
            .arg("-initrd")
            .arg(initrd)
            .args(["-append", "console=ttyS0 quiet panic=-1"])
            .args(devices)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("qemu-system-x86_64 is needed for this test (.ci/fetch-guest-kernel installs it)");
        let console = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        for mut stream in
            [Box::new(child.stdout.take().expect("stdout")) as Box<dyn Read + Send>, Box::new(child.stderr.take().expect("stderr"))]
        {
            let console = console.clone();
            readers.push(std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(read) = stream.read(&mut buffer) {
                    if read == 0 {
                        break;
                    }
                    console.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push_str(&String::from_utf8_lossy(&buffer[..read]));
                }
            }));
        }
        Self { child, console, readers, kernel: kernel.description.clone() }
    }

    /// What the guest printed so far, after a line naming the kernel it booted.
    pub fn console(&self) -> String {
        let printed = self.console.lock().unwrap_or_else(std::sync::PoisonError::into_inner).replace('\r', "");
        format!("[guest kernel: {}]\n{printed}", self.kernel)
    }

    /// Waits for the guest to power off (bounded: a hung guest is stopped); its console output and
    /// whether it powered off by itself.
    pub fn wait(&mut self, timeout: Duration) -> (String, bool) {
        let deadline = Instant::now() + timeout;
        let ended = loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                break true;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break false;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // QEMU is gone: its pipes close and the readers end with all it printed.
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        (self.console(), ended)
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
