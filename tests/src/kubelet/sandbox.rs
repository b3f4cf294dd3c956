//! One container as a process under bubblewrap, held to exactly what its spec and its image
//! declare.
//!
//! - **Image:** the root is the container's own copy of the image's root filesystem (see
//!   [`super::image`]): hard links when the root is read-only, a full copy when it is writable,
//!   like a container's writable layer (kept across the container's restarts here, where a
//!   runtime would start each one afresh). Nothing of the host's userland is visible. Mount
//!   points the image lacks are made in that copy first, as a runtime makes them. With
//!   `readOnlyRootFilesystem: true` the root, its `/tmp` included, is bound read-only; the
//!   volumes are mounted on top. The kubelet's `/etc/hosts` and `/etc/hostname` and the node's
//!   `/etc/resolv.conf` are bound over the image's empty files.
//! - **Process:** Kubernetes' rules: `command` replaces the image's entrypoint, `args` its
//!   default arguments (`Cmd`), and `command` alone drops them; `workingDir`, else the image's,
//!   else `/`.
//! - **Environment:** cleared, then a default `PATH`, `HOSTNAME`, the image's `Env`, the
//!   container's `env` (each replacing a variable of the same name, as containerd does), and
//!   `HOME` from the image's `/etc/passwd` for the user when still unset (`/` without an entry),
//!   as runc does.
//! - **Volumes:** only the container's `volumeMounts`, at their paths, read-only when the mount
//!   or the volume says so. Nothing else of the host or of the other containers is visible.
//! - **User:** `runAsUser`/`runAsGroup` (container, else pod), else the image's numeric `User`;
//!   `fsGroup` as a supplementary group. For real: `setpriv` drops to that user before
//!   bubblewrap starts, so every permission check is the kernel's own against the host's owners
//!   and modes. The process is PID 1 of its own PID namespace, as in a container: SIGTERM
//!   reaches it only if it handles it.
//! - **Network:** the pod's namespace, inherited from the thread that spawns it.
//! - **Looking around:** the images hold no shell. [`Sandbox::command_debugging`] binds a static
//!   busybox at [`DEBUG_DIR`], as `kubectl debug` adds an ephemeral container with tools, and
//!   only there.
//!
//! Not emulated: the seccomp profile, cgroup limits (`resources`), `sizeLimit`, `$(VAR)` in
//! `command` and `args`, the image's `/etc/group` memberships, user names in the image's `User`.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::image::Image;
use super::volumes::Volumes;

/// Where [`Sandbox::command_debugging`] binds its tools: busybox and a link per applet.
pub const DEBUG_DIR: &str = "/.debug";
/// The `PATH` containerd gives a container whose image sets none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The files the kubelet manages for every container of a pod, bound over the image's own.
#[derive(Debug, Clone)]
pub struct EtcFiles {
    hosts: PathBuf,
    hostname: PathBuf,
    resolv_conf: PathBuf,
}

impl EtcFiles {
    /// Writes the pod's `/etc/hosts` and `/etc/hostname` into `dir`. The pod's network has
    /// loopback only, so the hosts file names localhost only; `resolv.conf` is the node's.
    pub fn write(dir: &Path, hostname: &str) -> EtcFiles {
        let hosts = dir.join("etc-hosts");
        std::fs::write(
            &hosts,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n\
             ::1\tlocalhost ip6-localhost ip6-loopback\n",
        )
        .expect("write the pod's hosts file");
        let hostname_file = dir.join("etc-hostname");
        std::fs::write(&hostname_file, format!("{hostname}\n"))
            .expect("write the pod's hostname file");
        EtcFiles {
            hosts,
            hostname: hostname_file,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
        }
    }
}

/// The resolved constraints of one container.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    /// (volume's host path, mount path, read-only)
    pub mounts: Vec<(PathBuf, String, bool)>,
    pub env: Vec<(String, String)>,
    /// The image it runs.
    pub image: Image,
    /// Its root filesystem on the host: its own copy of the image's.
    pub root: PathBuf,
    /// The process: entrypoint and arguments.
    pub argv: Vec<String>,
    pub working_dir: String,
    pub hostname: String,
    etc: EtcFiles,
    /// The container's directory on the host: its root, its debug tools.
    dir: PathBuf,
}

impl Sandbox {
    /// The constraints `container` declares, in `pod`, with the pod's `volumes`, running
    /// `image`; its root is made under `containers` (which its user can pass through).
    pub fn of(
        container: &Container,
        pod: &PodSpec,
        hostname: &str,
        volumes: &Volumes,
        image: &Image,
        etc: &EtcFiles,
        containers: &Path,
    ) -> Sandbox {
        let name = &container.name;
        let pod_security = pod.security_context.clone().unwrap_or_default();
        let security = container.security_context.clone().unwrap_or_default();
        let id = |value: i64, what: &str| {
            u32::try_from(value).unwrap_or_else(|_| panic!("{name}: {what} {value}"))
        };
        let (image_uid, image_gid) = image_user(name, image);
        let run_as_user = security.run_as_user.or(pod_security.run_as_user);
        let uid = run_as_user.map_or(image_uid.unwrap_or(0), |u| id(u, "runAsUser"));
        let passwd = passwd_entry(&image.rootfs, uid);
        let gid = match security.run_as_group.or(pod_security.run_as_group) {
            Some(g) => id(g, "runAsGroup"),
            None => image_gid
                .filter(|_| run_as_user.is_none())
                .or(passwd.as_ref().map(|(gid, _)| *gid))
                .unwrap_or(0),
        };
        let non_root = security.run_as_non_root.or(pod_security.run_as_non_root);
        // The kubelet refuses to start such a container.
        assert!(
            !(non_root == Some(true) && uid == 0),
            "{name}: runAsNonRoot, and it would run as root"
        );
        let mut groups: Vec<u32> = pod_security
            .supplemental_groups
            .iter()
            .flatten()
            .map(|&g| id(g, "supplementalGroups"))
            .collect();
        if let Some(fs_group) = pod_security.fs_group {
            groups.push(id(fs_group, "fsGroup"));
        }
        let mounts: Vec<(PathBuf, String, bool)> = container
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

        let config = &image.config;
        let mut env = Vec::new();
        set_var(&mut env, "PATH", DEFAULT_PATH);
        set_var(&mut env, "HOSTNAME", hostname);
        for variable in config.env.iter().flatten() {
            let (key, value) = variable.split_once('=').unwrap_or((variable, ""));
            set_var(&mut env, key, value);
        }
        for variable in container.env.iter().flatten() {
            set_var(
                &mut env,
                &variable.name,
                variable.value.as_deref().unwrap_or_default(),
            );
        }
        if !env.iter().any(|(k, _)| k == "HOME") {
            let home = passwd.map_or_else(|| "/".to_owned(), |(_, home)| home);
            set_var(&mut env, "HOME", &home);
        }

        let mut argv = container
            .command
            .clone()
            .or_else(|| config.entrypoint.clone())
            .unwrap_or_default();
        argv.extend(match (&container.command, &container.args) {
            (_, Some(args)) => args.clone(),
            (Some(_), None) => Vec::new(),
            (None, None) => config.cmd.clone().unwrap_or_default(),
        });
        assert!(
            !argv.is_empty(),
            "{name}: neither the container nor its image {} says what to run",
            image.reference
        );
        let working_dir = container
            .working_dir
            .clone()
            .or_else(|| config.working_dir.clone().filter(|d| !d.is_empty()))
            .unwrap_or_else(|| "/".to_owned());

        let read_only_root = security.read_only_root_filesystem == Some(true);
        let dir = containers.join(name);
        let root = dir.join("root");
        make_root(&image.rootfs, &dir, &root, read_only_root);
        for path in mounts.iter().map(|(_, path, _)| path).chain([&working_dir]) {
            mount_point(&root, path, true);
        }
        for path in ["/etc/hosts", "/etc/hostname", "/etc/resolv.conf"] {
            mount_point(&root, path, false);
        }
        Sandbox {
            name: name.clone(),
            uid,
            gid,
            groups,
            read_only_root,
            no_new_privileges: security.allow_privilege_escalation == Some(false),
            mounts,
            env,
            image: image.clone(),
            root,
            argv,
            working_dir,
            hostname: hostname.to_owned(),
            etc: etc.clone(),
            dir,
        }
    }

    /// The command that runs the container's process.
    pub fn command(&self) -> Command {
        let argv: Vec<OsString> = self.argv.iter().map(OsString::from).collect();
        self.bwrap(&argv, None)
    }

    /// The command that runs `argv` (its first element a path inside the image) in this
    /// container's sandbox instead of its process.
    pub fn command_running(&self, argv: &[OsString]) -> Command {
        self.bwrap(argv, None)
    }

    /// As [`Sandbox::command_running`], with a static busybox and a link per applet at
    /// [`DEBUG_DIR`], for looking around inside a sandbox whose image has no shell:
    /// `/.debug/sh -c '…'`, the script setting `PATH=/.debug` if it wants the applets by name.
    pub fn command_debugging(&self, argv: &[OsString]) -> Command {
        let tools = self.dir.join("debug");
        if !tools.exists() {
            make_toolbox(&tools);
        }
        mount_point(&self.root, DEBUG_DIR, true);
        self.bwrap(argv, Some(&tools))
    }

    fn bwrap(&self, argv: &[OsString], tools: Option<&Path>) -> Command {
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
            "--block-fd",
            "4",
            "--hostname",
        ])
        .arg(&self.hostname);
        // The image, then what the runtime and the kubelet add to it.
        cmd.arg(if self.read_only_root {
            "--ro-bind"
        } else {
            "--bind"
        })
        .arg(&self.root)
        .arg("/");
        cmd.args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]);
        for (host, path) in [
            (&self.etc.hosts, "/etc/hosts"),
            (&self.etc.hostname, "/etc/hostname"),
            (&self.etc.resolv_conf, "/etc/resolv.conf"),
        ] {
            cmd.arg("--ro-bind").arg(host).arg(path);
        }
        if let Some(tools) = tools {
            cmd.arg("--ro-bind").arg(tools).arg(DEBUG_DIR);
        }
        // The volumes.
        for (host, path, read_only) in &self.mounts {
            cmd.arg(if *read_only { "--ro-bind" } else { "--bind" })
                .arg(host)
                .arg(path);
        }
        cmd.arg("--clearenv");
        for (name, value) in &self.env {
            cmd.args(["--setenv", name, value]);
        }
        cmd.arg("--chdir")
            .arg(&self.working_dir)
            .arg("--")
            .args(argv);
        cmd
    }
}

/// Sets `name` to `value`, in place when it is already set.
fn set_var(env: &mut Vec<(String, String)>, name: &str, value: &str) {
    match env.iter_mut().find(|(k, _)| k == name) {
        Some((_, v)) => *v = value.to_owned(),
        None => env.push((name.to_owned(), value.to_owned())),
    }
}

/// The image's `User` as numbers, `uid[:gid]`. Names would need the image's `/etc/passwd`.
fn image_user(container: &str, image: &Image) -> (Option<u32>, Option<u32>) {
    let Some(user) = image.config.user.as_deref().filter(|u| !u.is_empty()) else {
        return (None, None);
    };
    let number = |part: &str| {
        part.parse::<u32>().unwrap_or_else(|_| {
            panic!(
                "{container}: the image {} runs as user {user:?}: only numeric users are emulated",
                image.reference
            )
        })
    };
    match user.split_once(':') {
        Some((uid, gid)) => (Some(number(uid)), Some(number(gid))),
        None => (Some(number(user)), None),
    }
}

/// The primary group and home of `uid` in the image's `/etc/passwd`.
fn passwd_entry(rootfs: &Path, uid: u32) -> Option<(u32, String)> {
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        match fields.as_slice() {
            [_, _, u, g, _, home, ..] if u.parse() == Ok(uid) => {
                Some((g.parse().ok()?, (*home).to_owned()))
            }
            _ => None,
        }
    })
}

/// The container's root: hard links to the image's files when read-only (nothing can change
/// them through it), a copy of its own when writable.
fn make_root(rootfs: &Path, dir: &Path, root: &Path, read_only: bool) {
    std::fs::create_dir_all(dir).expect("create the container's directory");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .expect("chmod the container's directory");
    let mut cp = Command::new("cp");
    cp.arg("-a");
    if read_only {
        cp.arg("--link");
    }
    let (code, _, err) = crate::run(cp.arg(rootfs).arg(root));
    assert_eq!(
        code,
        0,
        "copy {} to {}: {err}",
        rootfs.display(),
        root.display()
    );
}

/// Makes `path` (absolute, inside `root`) exist as a directory or an empty file, owned by
/// root, as a runtime makes a mount point the image lacks.
fn mount_point(root: &Path, path: &str, directory: bool) {
    let target = root.join(path.trim_start_matches('/'));
    if target.exists() {
        return;
    }
    if directory {
        std::fs::create_dir_all(&target)
    } else {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).expect("create a mount point's directory");
        }
        std::fs::write(&target, "")
    }
    .unwrap_or_else(|e| panic!("make the mount point {}: {e}", target.display()));
}

/// The debug tools in `dir`: a copy of the host's static busybox and a link per applet.
fn make_toolbox(dir: &Path) {
    let busybox = static_busybox();
    std::fs::create_dir_all(dir).expect("create the debug tools' directory");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .expect("chmod the debug tools' directory");
    std::fs::copy(&busybox, dir.join("busybox")).expect("copy busybox");
    let (code, applets, err) = crate::run(Command::new(&busybox).arg("--list"));
    assert_eq!(code, 0, "busybox --list: {err}");
    for applet in applets.lines().filter(|a| !a.is_empty() && *a != "busybox") {
        std::os::unix::fs::symlink("busybox", dir.join(applet)).expect("link a busybox applet");
    }
}

/// The host's busybox, which must be static: the images hold no libraries for it.
fn static_busybox() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let busybox = std::env::split_paths(&path)
        .chain([PathBuf::from("/bin")])
        .map(|dir| dir.join("busybox"))
        .find(|p| p.is_file())
        .expect("no busybox to look around a container with: install it (Debian: busybox-static)");
    let (_, out, err) = crate::run(Command::new("ldd").arg(&busybox));
    assert!(
        format!("{out}{err}").contains("not a dynamic executable"),
        "{} is not static, and the images hold no libraries for it: install Debian's \
         busybox-static",
        busybox.display()
    );
    busybox
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
///
/// bubblewrap holds the container's process before it runs the command (`--block-fd`) until
/// its pidfd is open here: a command that ends at once (a look around) is otherwise gone, and
/// its number free for another process, before it could be opened.
pub fn spawn(mut cmd: Command, log: &Path) -> Result<Running, String> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("open {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    // Close-on-exec: no other child started meanwhile inherits them.
    let (info, info_writer) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| e.to_string())?;
    let (release_reader, release) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| e.to_string())?;
    let mut info = std::fs::File::from(info);
    let mut release = std::fs::File::from(release);
    let writer_fd = info_writer.as_raw_fd();
    let reader_fd = release_reader.as_raw_fd();
    // SAFETY: dup2 is async-signal-safe; it runs in the forked child before exec, and gives
    // bubblewrap the info pipe as fd 3 and the release pipe as fd 4 (without close-on-exec,
    // unlike the originals).
    unsafe {
        cmd.pre_exec(move || {
            for (fd, target) in [(writer_fd, 3), (reader_fd, 4)] {
                if libc::dup2(fd, target) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("start bwrap: {e}"))?;
    drop(info_writer);
    drop(release_reader);
    // Ends a sandbox that was not released: closing the release pipe alone would run it.
    let mut stop = |e: String| {
        let _ = child.kill();
        let _ = child.wait();
        e
    };
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
            stop(format!(
                "bwrap reported no child pid ({text:?}); see {}",
                log.display()
            ))
        })?;
    let process = Process::open(pid).map_err(|e| stop(format!("pidfd_open {pid}: {e}")))?;
    release
        .write_all(b"1")
        .map_err(|e| stop(format!("release the container's process: {e}")))?;
    Ok(Running {
        child,
        process,
        _info: info,
    })
}
