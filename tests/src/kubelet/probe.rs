//! Probes as the kubelet runs them: an HTTP GET (a status from 200 to 399 passes) or a TCP
//! connect, to a port named or numbered in the container's spec, within `timeoutSeconds`. The
//! kubelet probes the pod's IP; here, the pod's loopback from inside its network namespace.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A probe's settings with the API's defaults applied.
#[derive(Debug, Clone)]
pub struct Prober {
    check: Check,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

#[derive(Debug, Clone)]
enum Check {
    Http { port: u16, path: String },
    Tcp { port: u16 },
}

impl Prober {
    pub fn new(probe: &Probe, container: &Container) -> Prober {
        let seconds = |value: Option<i32>, default: u64| {
            Duration::from_secs(value.map_or(default, |v| u64::try_from(v).unwrap_or(default)))
        };
        let count = |value: Option<i32>, default: u32| {
            value.map_or(default, |v| u32::try_from(v).unwrap_or(default))
        };
        let check = match (&probe.http_get, &probe.tcp_socket) {
            (Some(get), _) => Check::Http {
                port: port(&get.port, container),
                path: get.path.clone().unwrap_or_else(|| "/".into()),
            },
            (None, Some(tcp)) => Check::Tcp {
                port: port(&tcp.port, container),
            },
            (None, None) => unreachable!("refused by Manifest::parse"),
        };
        Prober {
            check,
            initial_delay: seconds(probe.initial_delay_seconds, 0),
            period: seconds(probe.period_seconds, 10),
            timeout: seconds(probe.timeout_seconds, 1),
            success_threshold: count(probe.success_threshold, 1),
            failure_threshold: count(probe.failure_threshold, 3),
        }
    }

    /// One probe: Ok, or why it failed.
    pub fn probe(&self) -> Result<(), String> {
        match &self.check {
            Check::Tcp { port } => TcpStream::connect_timeout(&loopback(*port), self.timeout)
                .map(drop)
                .map_err(|e| format!("tcp {port}: {e}")),
            Check::Http { port, path } => self.http_get(*port, path),
        }
    }

    fn http_get(&self, port: u16, path: &str) -> Result<(), String> {
        let fail = |e: std::io::Error| format!("GET :{port}{path}: {e}");
        let mut stream = TcpStream::connect_timeout(&loopback(port), self.timeout).map_err(fail)?;
        stream.set_read_timeout(Some(self.timeout)).map_err(fail)?;
        stream.set_write_timeout(Some(self.timeout)).map_err(fail)?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: kube-probe/1.35\r\n\
             Accept: */*\r\nConnection: close\r\n\r\n"
        )
        .map_err(fail)?;
        let mut response = Vec::new();
        let _ = stream.take(4096).read_to_end(&mut response);
        let head = String::from_utf8_lossy(&response);
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("GET :{port}{path}: no HTTP status in {head:?}"))?;
        if (200..400).contains(&status) {
            Ok(())
        } else {
            Err(format!("GET :{port}{path}: {status}"))
        }
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port(port: &IntOrString, container: &Container) -> u16 {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).expect("a port number"),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| u16::try_from(p.container_port).expect("a port number"))
            .unwrap_or_else(|| panic!("{} has no port named {name}", container.name)),
    }
}
