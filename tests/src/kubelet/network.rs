//! The pod's network namespace: its own loopback, its own ports, its own `net.*` sysctls.
//!
//! Every container of a pod shares one network namespace, which the kubelet creates with the pod
//! sandbox before any container starts. Here it is a namespace made by a thread that unshares
//! its network and keeps a handle to it. A thread joins it with [`Network::enter`]: the
//! containers (processes started by such a thread inherit it), the probes, and the test's own
//! clients and backends, which then reach the pod on its loopback address. Nothing leaves this
//! machine, and the pod may listen on 80 and 443 without touching the host's ports.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd};
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

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

    /// Runs `ip args` in this namespace.
    fn ip(&self, args: &[&str]) {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    self.enter();
                    let status = Command::new("ip")
                        .args(args)
                        .status()
                        .expect("run `ip` (Debian's iproute2; scripts/test installs it)");
                    assert!(status.success(), "ip {}: {status}", args.join(" "));
                })
                .join()
                .expect("run ip in a network namespace");
        });
    }

    /// The namespace as a path `ip` can open.
    fn path(&self) -> String {
        format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.namespace.as_raw_fd()
        )
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

/// A node of a cluster, for pods that must reach services and be reached by a load balancer: a
/// network namespace of its own (the node's) where the cluster's services listen at
/// [`Node::SERVICE_IP`] (the ACME CA, the DNS server, the backends), and each pod's namespace
/// wired to it by a veth pair, as a CNI plugin wires pods to their node. The pod's side is its
/// `eth0` with an address of its own and a default route through the node; the node reaches
/// the pod at that address. A pod's wiring goes with its namespace.
pub struct Node {
    network: Network,
    pods: AtomicU8,
}

impl Node {
    /// Where the cluster's services listen, on the node's loopback.
    pub const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

    pub fn new() -> Node {
        let network = Network::new();
        network.ip(&[
            "addr",
            "add",
            &format!("{}/32", Node::SERVICE_IP),
            "dev",
            "lo",
        ]);
        Node {
            network,
            pods: AtomicU8::new(0),
        }
    }

    /// The node's own namespace: a thread that enters it starts the services and the clients.
    pub fn network(&self) -> &Network {
        &self.network
    }

    /// A new pod network wired to the node, and the pod's address: 10.244.n.2, the node's end
    /// being 10.244.n.1 (a /30 per pod, so no bridge is needed).
    pub fn attach(&self) -> (Network, Ipv4Addr) {
        let n = self.pods.fetch_add(1, Ordering::SeqCst);
        let pod = Network::new();
        let (node_end, pod_end) = (format!("vn{n}"), format!("vp{n}"));
        let (node_ip, pod_ip) = (Ipv4Addr::new(10, 244, n, 1), Ipv4Addr::new(10, 244, n, 2));
        self.network.ip(&[
            "link", "add", &node_end, "type", "veth", "peer", "name", &pod_end,
        ]);
        self.network
            .ip(&["link", "set", &pod_end, "netns", &pod.path()]);
        self.network
            .ip(&["addr", "add", &format!("{node_ip}/30"), "dev", &node_end]);
        self.network.ip(&["link", "set", &node_end, "up"]);
        pod.ip(&["link", "set", &pod_end, "name", "eth0"]);
        pod.ip(&["addr", "add", &format!("{pod_ip}/30"), "dev", "eth0"]);
        pod.ip(&["link", "set", "eth0", "up"]);
        pod.ip(&["route", "add", "default", "via", &node_ip.to_string()]);
        (pod, pod_ip)
    }
}

impl Default for Node {
    fn default() -> Self {
        Node::new()
    }
}
