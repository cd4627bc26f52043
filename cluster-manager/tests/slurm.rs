//! Flyt GPUs inside a real Slurm (Debian's packages; `docs/design/slurm.md`): a one-machine
//! cluster (munged, slurmctld, slurmd, with a generated slurm.conf, Flyt's SPANK plugin and
//! cli_filter.lua) over a Flyt cluster of real processes (`harness`: a cluster manager, a node
//! manager with one emulated GPU, the node's client manager with its job socket).
//!
//! - `flytctl slurm sync` gives Slurm one `flyt` license per GPU Slurm's jobs may have;
//! - `srun --flyt-gpus=1 ./app` runs a CUDA program through Flyt and prints its result, the job's
//!   AdminComment names its allocation, and the allocation goes when the job ends;
//! - a second job asking for more than is free waits (reason Licenses) and runs when the first
//!   ends; `scancel` of a running job releases its allocation within 5 s;
//! - a job killed by its time limit gives its GPU back too.
//!
//! Needs root (Slurm's daemons launch the jobs) and the packages `tools/test` installs
//! (`.ci/install-slurm`). Without them the test is skipped with a notice, unless
//! FLYT_REQUIRE_SLURM=1 (CI), which makes their absence a failure.

#[cfg(test)]
#[allow(dead_code, unused_imports, reason = "the harness serves several test binaries; this one uses part of it")]
mod harness;

#[cfg(test)]
mod tests {
    use std::{
        fs,
        path::{Path, PathBuf},
        process::{Child, Command, Stdio},
        time::{Duration, Instant},
    };

    use flyt_test_support::{artifact, run_with_timeout};

    use crate::harness::{Cluster, Options, Value, wait_until};

    /// Where Debian puts the daemons and commands.
    const PROGRAMS: [&str; 8] = ["munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "scancel"];
    const SUM: &str = "sum of 1024 values read back: 524800";

    fn find_program(name: &str) -> Option<PathBuf> {
        ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin"]
            .iter()
            .map(|dir| Path::new(dir).join(name))
            .find(|path| path.is_file())
    }

    /// Whether the test can run here; `None` with the reason when it cannot.
    fn slurm_missing() -> Option<String> {
        let missing: Vec<&str> = PROGRAMS.into_iter().filter(|name| find_program(name).is_none()).collect();
        if !missing.is_empty() {
            return Some(format!(
                "{} not installed (.ci/install-slurm installs Debian's slurmctld, slurmd, slurm-client and munge)",
                missing.join(", ")
            ));
        }
        if std::os::unix::fs::MetadataExt::uid(&fs::metadata("/proc/self").unwrap()) != 0 {
            return Some("not root: Slurm's daemons launch the jobs and need root".into());
        }
        None
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    fn short_hostname() -> String {
        let name = flyt_daemon_kit::host::hostname();
        name.split('.').next().unwrap().to_string()
    }

    /// A one-machine Slurm cluster; dropping it cancels its jobs and stops its daemons.
    struct Slurm {
        dir: PathBuf,
        daemons: Vec<(String, Child)>,
    }

    impl Slurm {
        fn conf(&self) -> PathBuf {
            self.dir.join("slurm.conf")
        }

        /// Starts munged, slurmctld and slurmd in `dir`, with Flyt's plugin reading `lib_dir`
        /// and asking the client manager at `job_socket`.
        fn start(dir: &Path, lib_dir: &Path, job_socket: &Path) -> Self {
            for sub in ["munge", "state", "spool", "log"] {
                fs::create_dir_all(dir.join(sub)).unwrap();
            }
            let key: Vec<u8> = (0..1024u32).map(|index| u8::try_from((index * 7919 + std::process::id()) % 251).unwrap()).collect();
            let key_file = dir.join("munge/munge.key");
            fs::write(&key_file, key).unwrap();
            fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o400)).unwrap();
            let munge_socket = dir.join("munge/socket");
            let mut slurm = Self { dir: dir.to_path_buf(), daemons: Vec::new() };
            let munged = Command::new(find_program("munged").unwrap())
                .args(["-F", "-f"])
                .arg(format!("--socket={}", munge_socket.display()))
                .arg(format!("--key-file={}", key_file.display()))
                .arg(format!("--pid-file={}", dir.join("munge/munged.pid").display()))
                .arg(format!("--log-file={}", dir.join("log/munged.log").display()))
                .arg(format!("--seed-file={}", dir.join("munge/seed").display()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            slurm.daemons.push(("munged".into(), munged));
            wait_until("munged's socket", Duration::from_secs(10), || munge_socket.exists().then_some(()));

            let plugin = artifact("libflyt_spank.so");
            fs::write(
                dir.join("plugstack.conf"),
                format!(
                    "required {} lib_dir={} socket={} timeout=60 slurm_conf={}\n",
                    plugin.display(),
                    lib_dir.display(),
                    job_socket.display(),
                    dir.join("slurm.conf").display()
                ),
            )
            .unwrap();
            fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("../slurm-spank/cli_filter.lua"), dir.join("cli_filter.lua")).unwrap();
            let host = short_hostname();
            let d = dir.display();
            let conf = format!(
                "ClusterName=flyttest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SlurmdDebug=verbose
PlugStackConfig={d}/plugstack.conf
CliFilterPlugins=cli_filter/lua
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=2
InactiveLimit=0
MinJobAge=600
OverTimeLimit=0
NodeName=flytnode NodeHostname={host} NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=flytnode Default=YES MaxTime=INFINITE State=UP
",
                ctld_port = free_port(),
                slurmd_port = free_port(),
                munge = munge_socket.display(),
            );
            fs::write(slurm.conf(), conf).unwrap();
            for (name, args) in [("slurmctld", vec!["-D", "-i"]), ("slurmd", vec!["-D", "-N", "flytnode"])] {
                let child = Command::new(find_program(name).unwrap())
                    .args(&args)
                    .arg("-f")
                    .arg(slurm.conf())
                    .env("SLURM_CONF", slurm.conf())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(fs::File::create(dir.join(format!("log/{name}.stderr"))).unwrap())
                    .spawn()
                    .unwrap();
                slurm.daemons.push((name.into(), child));
            }
            wait_until("the Slurm node idle", Duration::from_secs(60), || {
                let (code, out, _) = slurm.command("scontrol", &["show", "node", "flytnode"]);
                (code == 0 && out.contains("State=IDLE")).then_some(())
            });
            slurm
        }

        /// A Slurm command against this cluster: (exit code, stdout, stderr).
        fn command(&self, name: &str, args: &[&str]) -> (i32, String, String) {
            run_with_timeout(
                Command::new(find_program(name).unwrap()).args(args).env("SLURM_CONF", self.conf()).current_dir(&self.dir),
                Duration::from_secs(120),
            )
        }

        fn sbatch(&self, args: &[&str]) -> u32 {
            let (code, out, err) = self.command("sbatch", &[&["--parsable"], args].concat());
            assert_eq!(code, 0, "sbatch {args:?}: {out}{err}");
            out.trim().split(';').next().unwrap().parse().unwrap_or_else(|_| panic!("sbatch printed {out:?}"))
        }

        /// `squeue`'s state and reason of a job; `None` once it left the queue.
        fn queue_state(&self, job: u32) -> Option<(String, String)> {
            let (_, out, _) = self.command("squeue", &["-h", "-j", &job.to_string(), "-o", "%T|%r"]);
            let (state, reason) = out.trim().split_once('|')?;
            Some((state.to_string(), reason.to_string()))
        }

        fn show_job(&self, job: u32) -> String {
            self.command("scontrol", &["show", "job", &job.to_string()]).1
        }

        fn log_text(&self) -> String {
            let mut text = String::new();
            for entry in fs::read_dir(self.dir.join("log")).into_iter().flatten().flatten() {
                text.push_str(&format!(
                    "===== {} =====\n{}\n",
                    entry.path().display(),
                    fs::read_to_string(entry.path()).unwrap_or_default()
                ));
            }
            text
        }
    }

    impl Drop for Slurm {
        fn drop(&mut self) {
            let _ = self.command("scancel", &["--full", "--user=root"]);
            std::thread::sleep(Duration::from_secs(1));
            if std::thread::panicking() {
                eprintln!("{}", self.log_text());
                for entry in fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                    if entry.path().extension().is_some_and(|extension| extension == "out") {
                        eprintln!("===== {} =====\n{}", entry.path().display(), fs::read_to_string(entry.path()).unwrap_or_default());
                    }
                }
            }
            for (_, child) in self.daemons.iter_mut().rev() {
                let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline && child.try_wait().ok().flatten().is_none() {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// The job allocations `flytctl list-virt-servers` shows: (tenant, allocation id).
    fn job_allocations(cluster: &Cluster) -> Vec<(String, String)> {
        cluster
            .allocations()
            .iter()
            .filter(|allocation| allocation["vm_ip"].as_str().is_some_and(|tenant| tenant.starts_with("job-")))
            .map(|allocation: &Value| (allocation["vm_ip"].as_str().unwrap().to_string(), allocation["id"].as_str().unwrap().to_string()))
            .collect()
    }

    fn tenant(job: u32) -> String {
        format!("job-{job}@127.0.0.1")
    }

    /// Waits until job `job`'s allocation is listed; its id.
    fn wait_allocated(cluster: &Cluster, job: u32) -> String {
        wait_until(&format!("job {job}'s allocation listed"), Duration::from_secs(60), || {
            job_allocations(cluster).into_iter().find(|(name, _)| *name == tenant(job)).map(|(_, id)| id)
        })
    }

    /// How long after `since` job `job`'s allocation left `flytctl list-virt-servers`.
    fn released_after(cluster: &Cluster, job: u32, since: Instant, limit: Duration) -> Duration {
        wait_until(&format!("job {job}'s allocation released"), limit, || {
            (!job_allocations(cluster).iter().any(|(name, _)| *name == tenant(job))).then(|| since.elapsed())
        })
    }

    use flyt_protocol::jobs::{JobReply, JobRequest, JobShape};

    /// The variable that makes [`job_socket_helper`] ask, as whichever user it runs as.
    const HELPER_SOCKET: &str = "FLYT_TEST_JOB_SOCKET_HELPER";

    fn ask(socket: &Path, request: &JobRequest) -> JobReply {
        let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        flyt_protocol::jobs::ask(&mut stream, request).unwrap()
    }

    /// Not a test of its own: the job socket test runs this binary again, as another user,
    /// with [`HELPER_SOCKET`] set, to ask as that user.
    #[test]
    fn job_socket_helper() {
        let Some(socket) = std::env::var_os(HELPER_SOCKET) else { return };
        println!("REPLY {:?}", ask(Path::new(&socket), &JobRequest::Release { job: 5 }));
    }

    fn granted(reply: &JobReply) -> (String, String, u32, u64) {
        match reply {
            JobReply::Granted { allocation_id, token, compute_units, memory_mib, .. } => {
                (allocation_id.clone(), token.clone(), *compute_units, *memory_mib)
            }
            other => panic!("not granted: {other:?}"),
        }
    }

    /// The client manager's job socket without Slurm: one allocation per job however many steps
    /// ask, slices and whole GPUs refused at once with the reason when they do not fit (nothing
    /// left behind), only root and job_uids served, garbage survived, the job's lease renewed
    /// past the client timeout and idle grace, and the release idempotent.
    #[test]
    fn the_job_socket_places_each_job_once_and_serves_only_root() {
        if !std::os::unix::fs::MetadataExt::uid(&fs::metadata("/proc/self").unwrap()).eq(&0) {
            eprintln!("SKIPPED the job socket test: not root (it asks as another user too)");
            return;
        }
        let mut cluster = Cluster::new(Options::default());
        cluster.start_node("node-a", "127.0.0.1", 40, 4096);
        cluster.wait_node_up("node-a");
        // A folder another user may reach: the socket's own checks are under test.
        let open = tempfile::Builder::new().prefix("flyt-jobs").tempdir_in("/tmp").unwrap();
        fs::set_permissions(open.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let socket = open.path().join("jobs.sock");
        cluster.start_client_manager_with(
            "127.0.0.1",
            &[("FLYT_CLIENT_MANAGER_JOB_SOCKET", socket.display().to_string()), ("FLYT_CLIENT_MANAGER_JOB_UIDS", "[4242]".into())],
        );
        let slice = JobShape::parse("1,sms=20,memory=1G").unwrap();
        let first = ask(&socket, &JobRequest::Allocate { job: 5, shape: slice });
        let (id, token, units, memory) = granted(&first);
        assert_eq!((units, memory), (20, 1024));
        assert!(matches!(&first, JobReply::Granted { tenant, .. } if tenant == "job-5@127.0.0.1"), "{first:?}");
        // A second step of the job: the same allocation and token.
        assert_eq!(granted(&ask(&socket, &JobRequest::Allocate { job: 5, shape: slice })), (id.clone(), token, 20, 1024));
        assert_eq!(job_allocations(&cluster), vec![(tenant(5), id.clone())]);
        // What does not fit is refused now, and leaves no requirement behind.
        let too_big = ask(&socket, &JobRequest::Allocate { job: 6, shape: JobShape::parse("1,sms=30,memory=1G").unwrap() });
        assert!(matches!(&too_big, JobReply::Refused { reason } if reason.contains("short by 10 SMs")), "{too_big:?}");
        let whole = ask(&socket, &JobRequest::Allocate { job: 7, shape: JobShape::parse("1").unwrap() });
        assert!(matches!(&whole, JobReply::Refused { reason } if reason.contains("with nothing allocated")), "{whole:?}");
        let vms = cluster.json(&["list-vms"]).to_string();
        assert!(vms.contains("job-5@127.0.0.1") && !vms.contains("job-6@") && !vms.contains("job-7@"), "{vms}");
        // Another user is refused by its credentials.
        let (code, out, err) = run_with_timeout(
            std::os::unix::process::CommandExt::uid(
                Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", "tests::job_socket_helper", "--nocapture", "--test-threads=1"])
                    .env(HELPER_SOCKET, &socket),
                65534,
            ),
            Duration::from_secs(60),
        );
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains("REPLY Refused") && out.contains("may not ask for jobs' GPUs"), "{out}{err}");
        // Garbage is dropped; the socket goes on serving.
        let mut garbage = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        std::io::Write::write_all(&mut garbage, &[0xff; 64]).unwrap();
        let mut rest = Vec::new();
        garbage.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = std::io::Read::read_to_end(&mut garbage, &mut rest);
        assert!(rest.is_empty(), "a reply to garbage: {rest:?}");
        // The job's lease outlives the client timeout and the idle grace (2 s each here).
        std::thread::sleep(Duration::from_secs(6));
        assert_eq!(job_allocations(&cluster), vec![(tenant(5), id.clone())]);
        // The release, twice.
        assert_eq!(ask(&socket, &JobRequest::Release { job: 5 }), JobReply::Released { allocation_id: Some(id) });
        assert!(job_allocations(&cluster).is_empty());
        assert_eq!(ask(&socket, &JobRequest::Release { job: 5 }), JobReply::Released { allocation_id: None });
        assert!(!cluster.json(&["list-vms"]).to_string().contains("job-5@"));
        // A node that dies (its client manager gone) takes its jobs' GPUs with it: the job's
        // lease lapses, its idle allocation is released and its requirement forgotten.
        let (id, ..) = granted(&ask(&socket, &JobRequest::Allocate { job: 8, shape: slice }));
        assert_eq!(job_allocations(&cluster), vec![(tenant(8), id)]);
        let manager_socket = cluster.path("client-manager-127.0.0.1.sock");
        cluster.kill_client_manager(&manager_socket);
        wait_until("the dead node's job released and forgotten", Duration::from_secs(30), || {
            (job_allocations(&cluster).is_empty() && !cluster.json(&["list-vms"]).to_string().contains("job-8@")).then_some(())
        });
    }

    #[test]
    fn jobs_get_flyt_gpus_queue_for_them_and_give_them_back_however_they_end() {
        if let Some(reason) = slurm_missing() {
            assert!(std::env::var_os("FLYT_REQUIRE_SLURM").is_none_or(|value| value != "1"), "FLYT_REQUIRE_SLURM=1 but {reason}");
            eprintln!("SKIPPED the Slurm test: {reason}");
            return;
        }
        let mut cluster = Cluster::new(Options::default());
        cluster.start_node("node-a", "127.0.0.1", 40, 4096);
        cluster.wait_node_up("node-a");
        let job_socket = cluster.path("jobs.sock");
        cluster.start_client_manager_with("127.0.0.1", &[("FLYT_CLIENT_MANAGER_JOB_SOCKET", job_socket.display().to_string())]);

        // Flyt's library folder and the app, in a folder the jobs run in.
        let dir = cluster.path("slurm");
        let (lib, app) = crate::harness::flyt_lib_and_app(&dir, &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slurm/app.c"));
        let slurm = Slurm::start(&dir, &lib, &job_socket);
        let app = app.display().to_string();

        // --- The licenses: one per GPU Slurm's jobs may have.
        let synced = cluster.flytctl_ok(&["slurm", "sync", "--slurm-conf", slurm.conf().to_str().unwrap()]);
        assert!(synced.contains("flyt licenses: 1 (was none)"), "{synced}");
        let (_, licenses, _) = slurm.command("scontrol", &["show", "licenses"]);
        assert!(licenses.contains("LicenseName=flyt") && licenses.contains("Total=1"), "{licenses}");
        let again = cluster.flytctl_ok(&["slurm", "sync", "--slurm-conf", slurm.conf().to_str().unwrap()]);
        assert!(again.contains("flyt licenses: 1 (unchanged)"), "{again}");

        // --- srun --flyt-gpus=1 ./app: through Flyt, on the emulated GPU.
        let (code, out, err) = slurm.command("srun", &["--flyt-gpus=1", "--job-name=first", &app]);
        assert_eq!(code, 0, "srun:\n{out}\n{err}\n{}", cluster.log("client-manager-127.0.0.1"));
        assert!(out.contains("device 0: Flyt Emulated Device") && out.contains(SUM) && out.contains("done"), "{out}\n{err}");
        let (_, first, _) = slurm.command("squeue", &["-h", "--states=all", "-n", "first", "-o", "%i"]);
        let first: u32 = first.trim().parse().unwrap_or_else(|_| panic!("squeue printed {first:?}"));
        let shown = slurm.show_job(first);
        assert!(shown.contains("AdminComment=flyt: allocation ") && shown.contains(&format!("({})", tenant(first))), "{shown}");
        assert!(shown.contains("node-a GPU 0: 1 GPU(s) of 40 SMs and 4096 MiB"), "{shown}");
        released_after(&cluster, first, Instant::now(), Duration::from_secs(10));
        // A bad value stops srun before any job exists.
        let (code, _, err) = slurm.command("srun", &["--flyt-gpus=1,sms=4", &app]);
        assert_ne!(code, 0);
        assert!(err.contains("both sms= and memory="), "{err}");
        // A slice no GPU can hold: the step fails, saying why, and nothing is left allocated.
        // (Slurm 22.05's srun exits 0 when no task could start; it says so on stderr.)
        let (_, _, err) = slurm.command("srun", &["--flyt-gpus=1,sms=100,memory=1G", "--job-name=too-big", &app]);
        assert!(err.contains("launch failed"), "{err}");
        let (_, refused, _) = slurm.command("squeue", &["-h", "--states=all", "-n", "too-big", "-o", "%i"]);
        let shown = slurm.show_job(refused.trim().parse().unwrap_or_else(|_| panic!("squeue printed {refused:?}")));
        assert!(shown.contains("AdminComment=flyt: no GPUs: ") && shown.contains("short by 60 SMs"), "{shown}");
        assert!(job_allocations(&cluster).is_empty(), "{:?}", job_allocations(&cluster));

        // --- A second job waits for the license while the first holds the GPU; scancel of the
        // first gives the GPU back within 5 s, and the second runs.
        let holder = slurm.sbatch(&["--flyt-gpus=1", "--output=holder.out", "--wrap", &format!("{app} 600")]);
        let holder_allocation = wait_allocated(&cluster, holder);
        let listed = cluster.flytctl_ok(&["list-virt-servers", "--wide"]);
        assert!(listed.contains(&holder_allocation) && listed.contains(&tenant(holder)), "{listed}");
        wait_until("the holder's app placed on the GPU", Duration::from_secs(60), || {
            fs::read_to_string(dir.join("holder.out")).ok().filter(|out| out.contains("holding the session")).map(|_| ())
        });
        let waiter = slurm.sbatch(&["--flyt-gpus=1", "--output=waiter.out", "--wrap", &format!("{app} 0")]);
        let (state, reason) = wait_until("the second job waiting for the license", Duration::from_secs(30), || {
            slurm.queue_state(waiter).filter(|(state, reason)| state == "PENDING" && reason == "Licenses")
        });
        assert_eq!((state.as_str(), reason.as_str()), ("PENDING", "Licenses"));
        assert!(!job_allocations(&cluster).iter().any(|(name, _)| *name == tenant(waiter)));
        let cancelled = Instant::now();
        let (code, _, err) = slurm.command("scancel", &[&holder.to_string()]);
        assert_eq!(code, 0, "{err}");
        let took = released_after(&cluster, holder, cancelled, Duration::from_secs(20));
        eprintln!("scancel to release: {took:?}");
        assert!(took <= Duration::from_secs(5), "scancel to release took {took:?}");
        wait_until("the second job done", Duration::from_secs(90), || {
            let out = fs::read_to_string(dir.join("waiter.out")).unwrap_or_default();
            (slurm.queue_state(waiter).is_none() && out.contains("done")).then_some(())
        });
        let out = fs::read_to_string(dir.join("waiter.out")).unwrap();
        assert!(out.contains(SUM), "{out}");
        assert!(slurm.show_job(waiter).contains("JobState=COMPLETED"), "{}", slurm.show_job(waiter));
        released_after(&cluster, waiter, Instant::now(), Duration::from_secs(10));

        // --- A job its time limit kills gives its GPU back as well.
        let limited = slurm.sbatch(&["--flyt-gpus=1", "--time=1", "--output=limited.out", "--wrap", &format!("{app} 600")]);
        wait_allocated(&cluster, limited);
        let ended = wait_until("the time limit to end the job", Duration::from_secs(200), || {
            slurm.queue_state(limited).filter(|(state, _)| state == "RUNNING").is_none().then(Instant::now)
        });
        let took = released_after(&cluster, limited, ended, Duration::from_secs(20));
        eprintln!("time limit to release: {took:?}");
        assert!(took <= Duration::from_secs(5), "time limit to release took {took:?}");
        // Out of RUNNING, the job may show COMPLETING a moment before TIMEOUT.
        wait_until("the job's record to say TIMEOUT", Duration::from_secs(30), || {
            slurm.show_job(limited).contains("JobState=TIMEOUT").then_some(())
        });
        assert!(job_allocations(&cluster).is_empty(), "{:?}", job_allocations(&cluster));
    }
}
