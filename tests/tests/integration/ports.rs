//! Routes of their own port, through a real sozu driven by the agent, with real clients and
//! servers: SSH and Redis over `'tcp` routes (the PROXY protocol read by the backend), two hosts
//! with their own certificates behind one `'tls_passthrough` port, datagrams over a `'udp`
//! route; a port's listener made and removed live; a workspace that takes a port twice refused
//! with its position while the last good one serves on.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use private_ingress_tests::live::{
    certificate, eventually, free_port, https_get, route_of, Backend, Process, Stack,
};
use private_ingress_tests::run;

const PATIENCE: Duration = Duration::from_secs(30);

/// A route record of `protocol` on `listen_port` of the ingress to `upstream`.
fn port_route(
    host: &str,
    protocol: &str,
    listen_port: u16,
    upstream: SocketAddr,
    extra: &str,
) -> String {
    format!(
        "{{ host = \"{host}\", protocol = '{protocol}, listen_port = {listen_port}, upstream = \"{}\", port = {}{extra} }}",
        upstream.ip(),
        upstream.port()
    )
}

/// `command` must exist: the test fails, saying what to install, rather than pass without it.
fn require(command: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {command}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{command} is missing: install {package} (scripts/test does)"
    );
}

/// An sshd on a free loopback port that lets the current user in with a key of the test's own;
/// the client's command line for it through `port` of the ingress.
struct Sshd {
    _process: Process,
    address: SocketAddr,
    key: std::path::PathBuf,
    user: String,
}

impl Sshd {
    fn start(dir: &Path) -> Sshd {
        require("/usr/sbin/sshd", "openssh-server");
        std::fs::create_dir_all(dir).unwrap();
        let keygen = |path: &Path| {
            let (code, out, err) = run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(path));
            assert_eq!(code, 0, "ssh-keygen: {out}{err}");
        };
        let host_key = dir.join("host_key");
        let client_key = dir.join("client_key");
        keygen(&host_key);
        keygen(&client_key);
        let authorized = dir.join("authorized_keys");
        std::fs::copy(client_key.with_extension("pub"), &authorized).unwrap();
        let port = free_port();
        let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // sshd wants its privilege-separation directory, as a packaged service has it.
        std::fs::create_dir_all("/run/sshd").ok();
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "ListenAddress 127.0.0.1\nPort {port}\nHostKey {}\nAuthorizedKeysFile {}\n\
                 PidFile {}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n",
                host_key.display(),
                authorized.display(),
                dir.join("sshd.pid").display()
            ),
        )
        .unwrap();
        let process = Process::spawn(
            Command::new("/usr/sbin/sshd")
                .arg("-D")
                .arg("-e")
                .arg("-f")
                .arg(&config),
            &dir.join("sshd.log"),
        );
        eventually(PATIENCE, "sshd listening", || {
            TcpStream::connect(address).ok()
        });
        let user = String::from_utf8_lossy(&Command::new("id").arg("-un").output().unwrap().stdout)
            .trim()
            .to_owned();
        Sshd {
            _process: process,
            address,
            key: client_key,
            user,
        }
    }

    /// Runs `remote` over SSH to `port` of loopback: (exit code, output).
    fn ssh(&self, port: u16, remote: &str) -> (i32, String) {
        let (code, out, err) = run(Command::new("ssh").args(["-i"]).arg(&self.key).args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            "-p",
            &port.to_string(),
            &format!("{}@127.0.0.1", self.user),
            remote,
        ]));
        (code, format!("{out}{err}"))
    }
}

/// A TCP server that reads a PROXY protocol v2 header, then sends back the client address the
/// header names and echoes what follows: what a backend behind `proxy_protocol = true` learns.
fn proxy_protocol_backend() -> (SocketAddr, mpsc::Receiver<Result<SocketAddr, String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let (sent, received) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let sent = sent.clone();
            std::thread::spawn(move || {
                let read = read_proxy_v2(&mut stream);
                let _ = sent.send(read.clone());
                if let Ok(client) = read {
                    let _ = stream.write_all(format!("{client}\n").as_bytes());
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            });
        }
    });
    (address, received)
}

/// The source address of a PROXY protocol v2 header (IPv4 over TCP), or why it is not one.
fn read_proxy_v2(stream: &mut TcpStream) -> Result<SocketAddr, String> {
    const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
    stream
        .set_read_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    let mut head = [0u8; 16];
    stream
        .read_exact(&mut head)
        .map_err(|e| format!("header: {e}"))?;
    if head[..12] != SIGNATURE {
        return Err(format!("no PROXY v2 signature: {:?}", &head[..12]));
    }
    let (version_command, family) = (head[12], head[13]);
    let length = usize::from(u16::from_be_bytes([head[14], head[15]]));
    let mut rest = vec![0u8; length];
    stream
        .read_exact(&mut rest)
        .map_err(|e| format!("addresses: {e}"))?;
    if version_command != 0x21 || family != 0x11 || length < 12 {
        return Err(format!(
            "not a PROXY v2 PROXY command over TCP/IPv4: {version_command:#x} {family:#x}"
        ));
    }
    let source = std::net::Ipv4Addr::new(rest[0], rest[1], rest[2], rest[3]);
    let port = u16::from_be_bytes([rest[8], rest[9]]);
    Ok(SocketAddr::new(source.into(), port))
}

/// SSH and Redis, each through a `'tcp` route of its own port; a backend behind
/// `proxy_protocol = true` told the client's address; a route added and removed live: its
/// listener made without a restart, and closed once the route is gone.
#[test]
fn tcp_routes_carry_ssh_and_redis_and_tell_a_backend_the_client_by_proxy_protocol() {
    require("redis-server", "redis-server");
    let mut stack = Stack::new();
    let sshd = Sshd::start(&stack.dir.path().join("sshd"));
    let redis_port = free_port();
    let _redis = Process::spawn(
        Command::new("redis-server").args([
            "--port",
            &redis_port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]),
        &stack.dir.path().join("redis.log"),
    );
    let redis: SocketAddr = format!("127.0.0.1:{redis_port}").parse().unwrap();
    eventually(PATIENCE, "redis listening", || {
        TcpStream::connect(redis).ok()
    });
    let (proxied, told) = proxy_protocol_backend();
    let web = Backend::start("web");
    certificate(&stack.tls_dir(), "git.in.example.org");
    let (ssh_port, redis_listen, proxied_listen) = (free_port(), free_port(), free_port());
    let routes = vec![
        format!(
            "{{ host = \"git.in.example.org\", upstream = \"{}\", port = {} }}",
            web.address.ip(),
            web.address.port()
        ),
        port_route("git.in.example.org", "tcp", ssh_port, sshd.address, ""),
        port_route("cache.in.example.org", "tcp", redis_listen, redis, ""),
    ];
    let traffic = stack.send_traffic();
    stack.write_workspace(&stack.workspace_text_of(&routes, &traffic));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);

    let (code, out) = eventually(PATIENCE, "ssh through the route", || {
        let (code, out) = sshd.ssh(ssh_port, "echo through-the-ingress");
        (code == 0).then_some((code, out))
    });
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("through-the-ingress"), "{out}");
    let (code, out, err) = run(Command::new("redis-cli").args([
        "-p",
        &redis_listen.to_string(),
        "SET",
        "ingress",
        "tcp",
    ]));
    assert_eq!((code, out.trim()), (0, "OK"), "{err}");
    let (_, out, _) =
        run(Command::new("redis-cli").args(["-p", &redis_listen.to_string(), "GET", "ingress"]));
    assert_eq!(out.trim(), "tcp");
    // Each redis-cli connection is counted once it ends, as a connection and not a request.
    let cache = format!(
        "host=\"cache.in.example.org\",route=\"pi-cache.in.example.org-tcp-{redis_listen}\""
    );
    let closed =
        format!("private_ingress_tcp_connections_closed_total{{end=\"closed\",{cache}}} 2\n");
    let metrics = eventually(PATIENCE, "both connections counted", || {
        let metrics = stack.metrics();
        metrics.contains(&closed).then_some(metrics)
    });
    assert!(
        metrics.contains(&format!("private_ingress_tcp_sent_bytes_total{{{cache}}} ")),
        "{metrics}"
    );
    assert!(
        !metrics.contains(&format!(
            "route=\"pi-cache.in.example.org-tcp-{redis_listen}\",le="
        )),
        "a connection is no request: {metrics}"
    );
    // The HTTPS route of the same host is untouched beside its TCP route.
    assert_eq!(
        https_get(stack.https, "git.in.example.org", "/")
            .unwrap()
            .body,
        "web"
    );
    let state = stack.state().unwrap();
    let ssh_route = state["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["listen_port"] == ssh_port)
        .unwrap()
        .clone();
    assert_eq!(ssh_route["protocol"], "tcp");
    assert_eq!(ssh_route["state"], "ok", "{ssh_route}");
    let status = stack.status_text();
    assert!(status.contains(&format!("tcp:{ssh_port}")), "{status}");

    // Added live: a listener sozu did not have, made without a restart.
    let mut with_proxied = routes.clone();
    with_proxied.push(port_route(
        "echo.in.example.org",
        "tcp",
        proxied_listen,
        proxied,
        ", proxy_protocol = true",
    ));
    stack.write_workspace(&stack.workspace_text_of(&with_proxied, ""));
    let conn = eventually(PATIENCE, "the new port taking connections", || {
        let mut conn = TcpStream::connect(("127.0.0.1", proxied_listen)).ok()?;
        conn.set_read_timeout(Some(PATIENCE)).ok()?;
        conn.write_all(b"ping\n").ok()?;
        let mut line = [0u8; 64];
        let n = conn.read(&mut line).ok().filter(|&n| n > 0)?;
        String::from_utf8_lossy(&line[..n])
            .contains(':')
            .then_some(conn)
    });
    let client = conn.local_addr().unwrap();
    let named = told
        .recv_timeout(PATIENCE)
        .expect("the backend saw a connection");
    // Earlier attempts may have reached it too: the last one is this client's.
    let named = std::iter::once(named)
        .chain(told.try_iter())
        .last()
        .unwrap();
    assert_eq!(named, Ok(client), "the PROXY header names the client");
    drop(conn.shutdown(std::net::Shutdown::Both));

    // Removed live: the port no longer takes connections, and the others go on.
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    eventually(PATIENCE, "the removed route's port closed", || {
        TcpStream::connect(("127.0.0.1", proxied_listen))
            .is_err()
            .then_some(())
    });
    let (code, out) = sshd.ssh(ssh_port, "echo still");
    assert_eq!(code, 0, "{out}");
    assert!(route_of(&stack.state().unwrap(), "echo.in.example.org").is_none());
}

/// Two hosts behind one `'tls_passthrough` port, each served by a backend that terminates TLS
/// with a certificate of its own, from a CA of the test's: `openssl s_client -servername` and
/// curl (verifying the chain) each get their host's certificate and page, untouched by sozu; a
/// name no route passes through gets no backend.
#[test]
fn tls_passthrough_hands_each_host_its_own_backend_untouched() {
    let mut stack = Stack::new();
    let dir = stack.dir.path().join("backends");
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "passthrough test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let listen = free_port();
    let mut routes = Vec::new();
    let mut servers = Vec::new();
    for name in ["vault", "kube"] {
        let host = format!("{name}.in.example.org");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![host.clone()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, host.clone());
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        let port = free_port();
        servers.push(Process::spawn(
            Command::new("openssl")
                .args([
                    "s_server",
                    "-quiet",
                    "-www",
                    "-accept",
                    &port.to_string(),
                    "-cert",
                ])
                .arg(dir.join(format!("{name}.crt")))
                .arg("-key")
                .arg(dir.join(format!("{name}.key"))),
            &dir.join(format!("{name}.log")),
        ));
        let upstream: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        eventually(PATIENCE, "the backend listening", || {
            TcpStream::connect(upstream).ok()
        });
        routes.push(port_route(&host, "tls_passthrough", listen, upstream, ""));
    }
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    for name in ["vault", "kube"] {
        let host = format!("{name}.in.example.org");
        let subject = eventually(PATIENCE, "the host's own certificate", || {
            let (_, out, _) = run(Command::new("sh").arg("-c").arg(format!(
                "echo | openssl s_client -connect 127.0.0.1:{listen} -servername {host} 2>/dev/null | openssl x509 -noout -subject"
            )));
            out.contains(&host).then_some(out)
        });
        assert!(subject.contains(&format!("CN = {host}")), "{subject}");
        let (code, out, err) = run(Command::new("curl")
            .args(["-sS", "--max-time", "20", "--cacert"])
            .arg(dir.join("ca.pem"))
            .args(["--resolve", &format!("{host}:{listen}:127.0.0.1")])
            .arg(format!("https://{host}:{listen}/")));
        assert_eq!(code, 0, "curl to {host}: {err}");
        assert!(out.contains("s_server"), "{host}: {out}");
    }
    // A name no route passes through: sozu has no backend for it, and the handshake fails.
    let (_, out, _) = run(Command::new("sh").arg("-c").arg(format!(
        "echo | timeout 20 openssl s_client -connect 127.0.0.1:{listen} -servername other.in.example.org 2>&1"
    )));
    assert!(!out.contains("BEGIN CERTIFICATE"), "{out}");
    drop(servers);
}

/// A `'udp` route: datagrams to its port reach the backend and its answers come back, for two
/// clients at once (a flow each).
#[test]
fn a_udp_route_forwards_datagrams_both_ways() {
    let backend = UdpSocket::bind("127.0.0.1:0").unwrap();
    let upstream = backend.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = backend.recv_from(&mut buf) {
            let mut answer = b"echo:".to_vec();
            answer.extend_from_slice(&buf[..n]);
            let _ = backend.send_to(&answer, from);
        }
    });
    let mut stack = Stack::new();
    let listen = free_port();
    let routes = vec![port_route(
        "syslog.in.example.org",
        "udp",
        listen,
        upstream,
        "",
    )];
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    for client in 0..2 {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let message = format!("client {client}");
        let answer = eventually(PATIENCE, "an answer through the route", || {
            socket
                .send_to(message.as_bytes(), ("127.0.0.1", listen))
                .ok()?;
            let mut buf = [0u8; 1500];
            let (n, _) = socket.recv_from(&mut buf).ok()?;
            Some(String::from_utf8_lossy(&buf[..n]).into_owned())
        });
        assert_eq!(answer, format!("echo:{message}"));
    }
}

/// An edit that takes a port twice is refused at its value, with file and line, and the last
/// good workspace serves on: the TCP route still carries its connections.
#[test]
fn an_edit_taking_a_port_twice_is_refused_and_the_route_serves_on() {
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = echo.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in echo.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let mut stack = Stack::new();
    let listen = free_port();
    let good = vec![port_route("db.in.example.org", "tcp", listen, upstream, "")];
    stack.write_workspace(&stack.workspace_text_of(&good, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    let echoed = |stack: &Stack| {
        let _ = stack;
        let mut conn = TcpStream::connect(("127.0.0.1", listen)).ok()?;
        conn.set_read_timeout(Some(PATIENCE)).ok()?;
        conn.write_all(b"hello").ok()?;
        let mut buf = [0u8; 5];
        conn.read_exact(&mut buf).ok()?;
        (&buf == b"hello").then_some(())
    };
    eventually(PATIENCE, "the route echoing", || echoed(&stack));
    let mut bad = good.clone();
    bad.push(port_route(
        "cache.in.example.org",
        "tcp",
        listen,
        upstream,
        "",
    ));
    stack.write_workspace(&stack.workspace_text_of(&bad, ""));
    let error = eventually(PATIENCE, "the edit refused", || {
        stack.state()?["workspace"]["last_error"]
            .as_str()
            .filter(|e| e.contains(&format!("listen_port {listen} is taken by routes[0]")))
            .map(str::to_owned)
    });
    assert!(
        error.contains("workspace.ncl:"),
        "with its position: {error}"
    );
    echoed(&stack).expect("the last good workspace serves on");
}

/// A TCP echo server that first says its name: which upstream a connection reached.
fn named_echo(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.write_all(format!("{name}\n").as_bytes());
        }
    });
    address
}

/// Which upstream a new connection to `port` reaches, by the name it says first.
fn reached(port: u16) -> Option<String> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(PATIENCE)).ok()?;
    let mut name = String::new();
    conn.read_to_string(&mut name).ok()?;
    Some(name.trim().to_owned())
}

/// A `'tcp` route spreads and drains its connections as an HTTPS route does its requests: a
/// drained upstream gets no new connection, and undrained it gets them again.
#[test]
fn a_tcp_route_drains_an_upstream_like_an_https_route() {
    let (blue, green) = (named_echo("blue"), named_echo("green"));
    let mut stack = Stack::new();
    let listen = free_port();
    let route = |blue_drained: bool| {
        format!(
            "{{ host = \"app.in.example.org\", protocol = 'tcp, listen_port = {listen}, upstreams = [\
             {{ upstream = \"{}\", port = {}, drain = {blue_drained} }}, \
             {{ upstream = \"{}\", port = {}, drain = {} }}] }}",
            blue.ip(),
            blue.port(),
            green.ip(),
            green.port(),
            !blue_drained
        )
    };
    stack.write_workspace(&stack.workspace_text_of(&[route(true)], ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    eventually(PATIENCE, "green taking the connections", || {
        (reached(listen)? == "green").then_some(())
    });
    for _ in 0..10 {
        assert_eq!(reached(listen).as_deref(), Some("green"));
    }
    stack.write_workspace(&stack.workspace_text_of(&[route(false)], ""));
    eventually(PATIENCE, "blue taking them once green drains", || {
        (reached(listen)? == "blue").then_some(())
    });
    for _ in 0..10 {
        assert_eq!(reached(listen).as_deref(), Some("blue"));
    }
}
