//! One container as a process under bubblewrap, held to exactly what its spec declares.
//!
//! - **Image:** the root is a fresh tmpfs holding the host's userland read-only (`/usr`, a few
//!   files of `/etc`, the merged-`/usr` links) and the image's entrypoint at its path in the
//!   image, bound from the locally built binary. Its `/tmp` is the image's own empty directory, not the
//!   host's. With `readOnlyRootFilesystem: true` the whole root, `/tmp` included, is remounted
//!   read-only after the volumes are mounted, as a container runtime does; without it the root
//!   is writable and private to the container, like a container's writable layer.
//! - **Volumes:** only the container's `volumeMounts`, at their paths, read-only when the mount
//!   or the volume says so. Nothing else of the host or of the other containers is visible.
//! - **User:** `runAsUser`/`runAsGroup` (container, else pod), with `fsGroup` as a supplementary
//!   group, for real: `setpriv` drops to that user before bubblewrap starts, so every
//!   permission check is the kernel's own against the host's owners and modes. The process is
//!   PID 1 of its own PID namespace, as in a container: SIGTERM reaches it only if it handles it.
//! - **Env and args:** the environment is cleared, then `PATH`, `HOSTNAME`, `HOME` and the
//!   declared `env`; the entrypoint gets the declared `args`.
//! - **Network:** the pod's namespace, inherited from the thread that spawns it.
//!
//! Not emulated: the seccomp profile, cgroup limits (`resources`), `sizeLimit`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::volumes::Volumes;

/// What an image reference runs: the entrypoint's path in the image, and the local binary that
/// stands for it.
#[derive(Debug, Clone)]
pub struct Image {
    pub entrypoint: PathBuf,
    pub binary: PathBuf,
}

/// Image references of the pod, mapped to local binaries.
#[derive(Debug, Clone, Default)]
pub struct Images(BTreeMap<String, Image>);

impl Images {
    pub fn with(mut self, reference: &str, entrypoint: &str, binary: &Path) -> Images {
        self.0.insert(
            reference.to_owned(),
            Image {
                entrypoint: PathBuf::from(entrypoint),
                binary: binary.to_owned(),
            },
        );
        self
    }

    /// The same images with their binaries linked (or copied) into `dir`, which the containers'
    /// users can reach: bubblewrap binds them as that user, and a binary under a private
    /// directory (`/root/.cache`) is out of its reach, as it is in no image.
    pub fn stage(&self, dir: &Path) -> Images {
        std::fs::create_dir_all(dir).expect("create the image directory");
        let staged = self
            .0
            .iter()
            .enumerate()
            .map(|(i, (reference, image))| {
                let name = image.binary.file_name().expect("a binary has a file name");
                let path = dir.join(format!("{i}-{}", name.to_string_lossy()));
                if std::fs::hard_link(&image.binary, &path).is_err() {
                    std::fs::copy(&image.binary, &path).expect("copy an image's binary");
                }
                let image = Image {
                    entrypoint: image.entrypoint.clone(),
                    binary: path,
                };
                (reference.clone(), image)
            })
            .collect();
        Images(staged)
    }

    fn get(&self, reference: &str) -> &Image {
        self.0
            .get(reference)
            .unwrap_or_else(|| panic!("no local binary stands for the image {reference}"))
    }
}

/// The host userland an image is made of, read-only. Distroless images hold no shell; these
/// roots do, so that a test can look around inside a container's sandbox.
const USERLAND: [&str; 6] = [
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/libexec",
    "/usr/share",
];
const MERGED_USR: [(&str, &str); 4] = [
    ("usr/bin", "/bin"),
    ("usr/sbin", "/sbin"),
    ("usr/lib", "/lib"),
    ("usr/lib64", "/lib64"),
];
/// The image's `/etc`: what distroless holds (users, name service, CA certificates), what the
/// host's tools resolve through (`alternatives`, the linker cache), and the files the kubelet
/// puts there (`hosts`, `resolv.conf`). Only these, so that mount points under `/etc` are made in
/// the image, never in the host's `/etc`.
const ETC: [&str; 9] = [
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "resolv.conf",
    "ld.so.cache",
    "localtime",
    "ssl",
    "alternatives",
];
/// What an image's `PATH` usually is.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The resolved constraints of one container.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    /// (volume's host path, mount path, read-only)
    pub mounts: Vec<(PathBuf, String, bool)>,
    pub env: Vec<(String, String)>,
    pub image: Image,
    pub args: Vec<String>,
    pub hostname: String,
}

impl Sandbox {
    /// The constraints `container` declares, in `pod`, with the pod's `volumes`.
    pub fn of(
        container: &Container,
        pod: &PodSpec,
        hostname: &str,
        volumes: &Volumes,
        images: &Images,
    ) -> Sandbox {
        let name = &container.name;
        let pod_security = pod.security_context.clone().unwrap_or_default();
        let security = container.security_context.clone().unwrap_or_default();
        let id = |value: Option<i64>, what: &str| {
            let value = value.unwrap_or_else(|| {
                panic!("{name} sets no {what}: the images' default users are not emulated")
            });
            u32::try_from(value).unwrap_or_else(|_| panic!("{name}: {what} {value}"))
        };
        let uid = id(
            security.run_as_user.or(pod_security.run_as_user),
            "runAsUser",
        );
        let gid = id(
            security.run_as_group.or(pod_security.run_as_group),
            "runAsGroup",
        );
        let non_root = security.run_as_non_root.or(pod_security.run_as_non_root);
        // The kubelet refuses to start such a container.
        assert!(
            !(non_root == Some(true) && uid == 0),
            "{name}: runAsNonRoot with runAsUser 0"
        );
        let mut groups: Vec<u32> = pod_security
            .supplemental_groups
            .iter()
            .flatten()
            .map(|&g| u32::try_from(g).expect("a group id"))
            .collect();
        if let Some(fs_group) = pod_security.fs_group {
            groups.push(u32::try_from(fs_group).expect("fsGroup is a group id"));
        }
        let mounts = container
            .volume_mounts
            .iter()
            .flatten()
            .map(|mount| {
                let volume = volumes.by_name.get(&mount.name).unwrap_or_else(|| {
                    panic!(
                        "{name} mounts {}, which the pod does not declare",
                        mount.name
                    )
                });
                let read_only = mount.read_only == Some(true) || !volume.writable;
                (volume.path.clone(), mount.mount_path.clone(), read_only)
            })
            .collect();
        let mut env = vec![
            ("PATH".to_owned(), PATH.to_owned()),
            ("HOSTNAME".to_owned(), hostname.to_owned()),
            ("HOME".to_owned(), "/".to_owned()),
        ];
        env.extend(
            container
                .env
                .iter()
                .flatten()
                .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default())),
        );
        let image_ref = container
            .image
            .as_deref()
            .unwrap_or_else(|| panic!("{name} has no image"));
        Sandbox {
            uid,
            gid,
            groups,
            read_only_root: security.read_only_root_filesystem == Some(true),
            no_new_privileges: security.allow_privilege_escalation == Some(false),
            mounts,
            env,
            image: images.get(image_ref).clone(),
            args: container.args.clone().unwrap_or_default(),
            hostname: hostname.to_owned(),
        }
    }

    /// The command that runs the container's entrypoint with its args.
    pub fn command(&self) -> Command {
        let mut argv: Vec<OsString> = vec![self.image.entrypoint.clone().into()];
        argv.extend(self.args.iter().map(OsString::from));
        self.command_running(&argv)
    }

    /// The command that runs `argv` (its first element a path inside the sandbox) in this
    /// container's sandbox instead of the entrypoint: for looking around inside it.
    pub fn command_running(&self, argv: &[OsString]) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid));
        if self.groups.is_empty() {
            cmd.arg("--clear-groups");
        } else {
            let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            cmd.arg(format!("--groups={}", groups.join(",")));
        }
        if self.no_new_privileges {
            cmd.arg("--no-new-privs");
        }
        cmd.arg("--").arg("bwrap");
        cmd.args(["--unshare-user", "--uid"])
            .arg(self.uid.to_string())
            .arg("--gid")
            .arg(self.gid.to_string());
        cmd.args([
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--as-pid-1",
            "--new-session",
            "--die-with-parent",
            "--info-fd",
            "3",
            "--hostname",
        ])
        .arg(&self.hostname);
        // The image.
        cmd.args(["--tmpfs", "/"]);
        for dir in USERLAND {
            if Path::new(dir).exists() {
                cmd.args(["--ro-bind", dir, dir]);
            }
        }
        for (target, link) in MERGED_USR {
            cmd.args(["--symlink", target, link]);
        }
        cmd.args(["--dir", "/etc"]);
        for name in ETC {
            let path = Path::new("/etc").join(name);
            if path.exists() {
                cmd.arg("--ro-bind").arg(&path).arg(&path);
            }
        }
        cmd.arg("--ro-bind")
            .arg(&self.image.binary)
            .arg(&self.image.entrypoint);
        cmd.args(["--perms", "1777", "--dir", "/tmp"]);
        cmd.args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]);
        // The volumes.
        for (host, path, read_only) in &self.mounts {
            cmd.arg(if *read_only { "--ro-bind" } else { "--bind" })
                .arg(host)
                .arg(path);
        }
        if self.read_only_root {
            cmd.args(["--remount-ro", "/"]);
        }
        cmd.arg("--clearenv");
        for (name, value) in &self.env {
            cmd.args(["--setenv", name, value]);
        }
        cmd.args(["--chdir", "/", "--"]).args(argv);
        cmd
    }
}

/// A sandboxed process: bubblewrap's own process, and the container's process (PID 1 inside).
pub struct Running {
    pub child: Child,
    pub process: Process,
    /// Kept open: bubblewrap holds the other end for as long as the container runs.
    _info: std::fs::File,
}

/// The container's process, held by a pidfd: a signal reaches that process or none, never one
/// that reuses its number after it is gone (numbers come round quickly on a busy machine).
#[derive(Debug, Clone)]
pub struct Process {
    /// As this machine numbers it.
    pub pid: i32,
    pidfd: std::sync::Arc<std::os::fd::OwnedFd>,
}

impl Process {
    fn open(pid: i32) -> std::io::Result<Process> {
        // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor, which is owned
        // here and nowhere else.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).map_err(std::io::Error::other)?;
        // SAFETY: `fd` was just returned by pidfd_open.
        let pidfd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Process {
            pid,
            pidfd: std::sync::Arc::new(pidfd),
        })
    }

    /// Sends `signal` to the process, if it still runs.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                signal as i32,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }
}

/// Starts `cmd` (from [`Sandbox::command`]) with its output appended to `log`, and learns the
/// container process's PID from bubblewrap's info file descriptor.
pub fn spawn(mut cmd: Command, log: &Path) -> Result<Running, String> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("open {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    // Close-on-exec: no other child started meanwhile inherits it.
    let (info, info_writer) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| e.to_string())?;
    let mut info = std::fs::File::from(info);
    let writer_fd = info_writer.as_raw_fd();
    // SAFETY: dup2 is async-signal-safe; it runs in the forked child before exec, and gives
    // bubblewrap the pipe as fd 3 (without close-on-exec, unlike the original).
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(writer_fd, 3) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("start bwrap: {e}"))?;
    drop(info_writer);
    // bubblewrap keeps the descriptor open while the container runs: read up to the end of its
    // first JSON object, not to the end of the stream.
    let mut text = String::new();
    let mut chunk = [0u8; 256];
    while !text.contains("\n}") {
        match info.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&chunk[..n])),
        }
    }
    let pid = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["child-pid"].as_i64())
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| {
            format!(
                "bwrap reported no child pid ({text:?}); see {}",
                log.display()
            )
        })?;
    let process = Process::open(pid).map_err(|e| format!("pidfd_open {pid}: {e}"))?;
    Ok(Running {
        child,
        process,
        _info: info,
    })
}
