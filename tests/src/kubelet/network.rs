//! The pod's network namespace: its own loopback, its own ports, its own `net.*` sysctls.
//!
//! Every container of a pod shares one network namespace, which the kubelet creates with the pod
//! sandbox before any container starts. Here it is a namespace made by a thread that unshares
//! its network and keeps a handle to it. A thread joins it with [`Network::enter`]: the
//! containers (processes started by such a thread inherit it), the probes, and the test's own
//! clients and backends, which then reach the pod on its loopback address. Nothing leaves this
//! machine, and the pod may listen on 80 and 443 without touching the host's ports.

use std::fs::File;
use std::os::fd::AsFd;
use std::process::Command;

use nix::sched::{setns, unshare, CloneFlags};

pub struct Network {
    namespace: File,
}

impl Network {
    /// A new network namespace with its loopback interface up.
    pub fn new() -> Network {
        std::thread::spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare the network namespace (needs root)");
            let namespace =
                File::open("/proc/thread-self/ns/net").expect("open the new network namespace");
            // A new namespace's loopback is down. `ip` runs in this thread's namespace.
            let status = Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status()
                .expect("run `ip` (Debian's iproute2; scripts/test installs it)");
            assert!(status.success(), "ip link set lo up: {status}");
            Network { namespace }
        })
        .join()
        .expect("create the pod's network namespace")
    }

    /// Moves the calling thread into the namespace: its sockets, and the processes it starts
    /// from now on, are the pod's.
    pub fn enter(&self) {
        setns(self.namespace.as_fd(), CloneFlags::CLONE_NEWNET)
            .expect("join the pod's network namespace");
    }

    /// Sets a network sysctl of the pod (`net.ipv4.ip_unprivileged_port_start`): `/proc/sys/net`
    /// shows the namespace of the thread that opens it.
    pub fn set_sysctl(&self, name: &str, value: &str) {
        assert!(
            name.starts_with("net."),
            "only network sysctls are scoped to the pod: {name}"
        );
        let path = format!("/proc/sys/{}", name.replace('.', "/"));
        let value = value.to_owned();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    self.enter();
                    std::fs::write(&path, &value)
                        .unwrap_or_else(|e| panic!("write {value} to {path}: {e}"));
                })
                .join()
                .expect("set a sysctl in the pod's namespace");
        });
    }
}

impl Default for Network {
    fn default() -> Self {
        Network::new()
    }
}
