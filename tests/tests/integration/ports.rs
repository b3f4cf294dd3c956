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

/// A TCP server that says its name first, then echoes what it reads until the client closes:
/// an SSH-like session, whose upstream the client can tell.
fn named_echo_session(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                if stream.write_all(format!("{name}\n").as_bytes()).is_err() {
                    return;
                }
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    address
}

/// A session open to `port`: the name of the upstream it reached, and the connection.
fn session(port: u16) -> Option<(String, TcpStream)> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(PATIENCE)).ok()?;
    let mut name = Vec::new();
    let mut byte = [0u8; 1];
    while name.last() != Some(&b'\n') {
        conn.read_exact(&mut byte).ok()?;
        name.push(byte[0]);
    }
    Some((String::from_utf8_lossy(&name).trim().to_owned(), conn))
}

/// Whether `conn` still echoes `message`.
fn echoes(conn: &mut TcpStream, message: &[u8]) -> Result<(), String> {
    conn.write_all(message).map_err(|e| format!("write: {e}"))?;
    let mut back = vec![0u8; message.len()];
    conn.read_exact(&mut back)
        .map_err(|e| format!("read: {e}"))?;
    (back == message)
        .then_some(())
        .ok_or_else(|| format!("echoed {:?}", String::from_utf8_lossy(&back)))
}

/// A drain on a `'tcp` route leaves the sessions open to the drained upstream alone (an SSH
/// session, a database's connections): they go on until they close, while every new
/// connection goes to the other upstream (docs/contract.md, "Kinds of routes").
#[test]
fn a_drain_on_a_tcp_route_keeps_the_sessions_open_to_the_drained_upstream() {
    let (blue, green) = (named_echo_session("blue"), named_echo_session("green"));
    let mut stack = Stack::new();
    let listen = free_port();
    let route = |blue_drained: bool| {
        format!(
            "{{ host = \"ssh.in.example.org\", protocol = 'tcp, listen_port = {listen}, upstreams = [\
             {{ upstream = \"{}\", port = {}, drain = {blue_drained} }}, \
             {{ upstream = \"{}\", port = {} }}] }}",
            blue.ip(),
            blue.port(),
            green.ip(),
            green.port(),
        )
    };
    stack.write_workspace(&stack.workspace_text_of(&[route(false)], ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    // Round robin over two: one of a few sessions reaches blue.
    let mut held = eventually(PATIENCE, "a session on blue", || {
        (0..4).find_map(|_| session(listen).filter(|(name, _)| name == "blue"))
    })
    .1;
    echoes(&mut held, b"before the drain\n").expect("the session echoes");

    stack.write_workspace(&stack.workspace_text_of(&[route(true)], ""));
    // The agent shows the upstream draining (or drained, once sozu says its last session
    // ended) once the pass that took it out has been applied.
    let blue_state = || {
        let state = stack.state()?;
        let upstreams = route_of(&state, "ssh.in.example.org")?["upstreams"].clone();
        upstreams
            .as_array()?
            .iter()
            .find(|u| u["upstream"] == blue.to_string().as_str())?["state"]
            .as_str()
            .map(str::to_owned)
    };
    eventually(PATIENCE, "blue taken out", || {
        blue_state().filter(|s| s.starts_with("drain"))
    });
    for _ in 0..10 {
        let (name, _) = session(listen).expect("a new session");
        assert_eq!(name, "green", "a new session after the drain");
    }
    for round in 0..3 {
        echoes(&mut held, format!("after the drain {round}\n").as_bytes())
            .expect("the session open to the drained upstream goes on");
    }
    // sozu still counts the session on blue: the drain goes on while it is open.
    assert_eq!(blue_state().as_deref(), Some("draining"));
}

/// A TCP server that says `name` on each connection and holds it open, idle, without a thread
/// per connection: the backend of many idle sessions.
fn holding_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            if stream.write_all(format!("{name}\n").as_bytes()).is_ok() {
                held.push(stream);
            }
        }
    });
    address
}

/// A `'tcp` route's `limits.connections_per_ip`: a client holding that many idle sessions has
/// the next one closed by sozu before it reaches a backend, while an HTTPS route still
/// handshakes and answers; once one of them closes, the client gets a session again.
#[test]
fn a_per_ip_limit_on_a_tcp_route_refuses_the_connection_past_it_and_https_still_answers() {
    const LIMIT: usize = 3;
    let backend = holding_backend("db");
    let web = Backend::start("web");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), "web.in.example.org");
    let listen = free_port();
    let routes = vec![
        format!(
            "{{ host = \"web.in.example.org\", upstream = \"{}\", port = {} }}",
            web.address.ip(),
            web.address.port()
        ),
        port_route(
            "db.in.example.org",
            "tcp",
            listen,
            backend,
            &format!(", limits.connections_per_ip = {LIMIT}"),
        ),
    ];
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);

    let mut held: Vec<TcpStream> = Vec::new();
    while held.len() < LIMIT {
        let (name, conn) = eventually(PATIENCE, "a session within the limit", || session(listen));
        assert_eq!(name, "db");
        held.push(conn);
    }
    // sozu accepts the next connection and closes it without a byte: the client reads the end.
    let mut past = TcpStream::connect(("127.0.0.1", listen)).expect("sozu accepts it");
    past.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0u8; 16];
    match past.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!(
            "the connection past the limit was not closed: {other:?} {:?}",
            String::from_utf8_lossy(&buf)
        ),
    }
    let seen = https_get(stack.https, "web.in.example.org", "/").expect("an HTTPS request");
    assert_eq!((seen.status, seen.body.as_str()), (200, "web"));
    for conn in &mut held {
        let mut byte = [0u8; 1];
        conn.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        assert!(
            matches!(conn.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut),
            "a session within the limit stays open"
        );
    }
    // One closes: sozu counts it out, and a new session is admitted.
    held.pop();
    let (name, _again) = eventually(PATIENCE, "a session once one closed", || session(listen));
    assert_eq!(name, "db");
}

/// Idle connections to a `'tcp` route no longer take sozu's capacity from HTTPS: 600 of them
/// through a sozu started from the rendered configuration (sozu's own defaults, 1,000 buffers
/// and two a TCP session, stopped it accepting at 500), and an HTTPS handshake still succeeds;
/// the agent's `/metrics` shows how full sozu is.
#[test]
fn idle_tcp_connections_leave_https_room_under_the_rendered_configuration() {
    const IDLE: usize = 600;
    let backend = holding_backend("idle");
    let web = Backend::start("web");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), "web.in.example.org");
    let listen = free_port();
    let routes = vec![
        format!(
            "{{ host = \"web.in.example.org\", upstream = \"{}\", port = {} }}",
            web.address.ip(),
            web.address.port()
        ),
        port_route("ssh.in.example.org", "tcp", listen, backend, ""),
    ];
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    let rendered = stack.dir.path().join("rendered.sozu.toml");
    let (code, _, err) = run(Command::new(private_ingress_tests::agent_bin())
        .arg("render")
        .arg(stack.workspace_path())
        .args(["--format", "sozu-toml", "--output"])
        .arg(&rendered)
        .arg("--sozu-socket")
        .arg(stack.socket()));
    assert_eq!(code, 0, "render: {err}");
    stack.start_sozu_with_config(&rendered);
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    eventually(PATIENCE, "the HTTPS route", || {
        https_get(stack.https, "web.in.example.org", "/").ok()
    });

    let mut idle = Vec::with_capacity(IDLE);
    for i in 0..IDLE {
        let (name, conn) =
            session(listen).unwrap_or_else(|| panic!("idle session {i} through the route"));
        assert_eq!(name, "idle");
        idle.push(conn);
    }
    let seen = https_get(stack.https, "web.in.example.org", "/")
        .expect("an HTTPS request beside the idle sessions");
    assert_eq!((seen.status, seen.body.as_str()), (200, "web"));
    let connections = eventually(PATIENCE, "sozu's connections in /metrics", || {
        let metrics = stack.metrics();
        let held =
            private_ingress_tests::live::sample(&metrics, "private_ingress_sozu_connections")?;
        let max =
            private_ingress_tests::live::sample(&metrics, "private_ingress_sozu_connections_max")?;
        (held >= IDLE as f64).then_some((held, max))
    });
    assert_eq!(connections.1, 4096.0, "{connections:?}");
    let metrics = stack.metrics();
    private_ingress_tests::live::promtool_check(&metrics)
        .unwrap_or_else(|e| panic!("{e}\n{metrics}"));
    drop(idle);
}

/// A UDP backend that answers each datagram with its length, and tells the test every length
/// it received.
fn measuring_udp_backend() -> (SocketAddr, mpsc::Receiver<usize>) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let address = socket.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let _ = tx.send(n);
            let _ = socket.send_to(format!("len:{n}").as_bytes(), from);
        }
    });
    (address, rx)
}

/// The answer to a datagram of `size` bytes sent to `port`, if one comes.
fn udp_answer(socket: &UdpSocket, port: u16, size: usize) -> Option<String> {
    socket
        .send_to(&vec![b'x'; size], ("127.0.0.1", port))
        .ok()?;
    let mut buf = [0u8; 64];
    let (n, _) = socket.recv_from(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// A `'udp` route's `max_datagram_size`: a datagram of 2,000 bytes reaches the backend through
/// a route that allows 4,096, and not through one left at sozu's 1,500 (dropped and counted,
/// while the small datagram sent after it is answered); raised by an edit, the running
/// listener takes it.
#[test]
fn a_udp_route_forwards_datagrams_up_to_its_max_datagram_size() {
    const LARGE: usize = 2000;
    let (upstream, received) = measuring_udp_backend();
    let mut stack = Stack::new();
    let (wide, narrow) = (free_port(), free_port());
    let routes = |narrow_size: &str| {
        vec![
            port_route(
                "wide.in.example.org",
                "udp",
                wide,
                upstream,
                ", max_datagram_size = 4096",
            ),
            port_route(
                "narrow.in.example.org",
                "udp",
                narrow,
                upstream,
                narrow_size,
            ),
        ]
    };
    stack.write_workspace(&stack.workspace_text_of(&routes(""), ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    // A client socket per step: an answer late for one step is never read by the next.
    let client = || {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        socket
    };
    let wide_client = client();
    let answer = eventually(
        PATIENCE,
        "the large datagram through the wide route",
        || udp_answer(&wide_client, wide, LARGE),
    );
    assert_eq!(answer, format!("len:{LARGE}"));

    // The narrow route: the large datagram is dropped; the small one after it is answered, so
    // the large one would have arrived first.
    let drained = |rx: &mpsc::Receiver<usize>| rx.try_iter().collect::<Vec<_>>();
    eventually(PATIENCE, "the narrow route answering", || {
        udp_answer(&client(), narrow, 10)
    });
    let narrow_client = client();
    narrow_client.set_read_timeout(Some(PATIENCE)).unwrap();
    drained(&received);
    narrow_client
        .send_to(&vec![b'x'; LARGE], ("127.0.0.1", narrow))
        .unwrap();
    assert_eq!(
        udp_answer(&narrow_client, narrow, 10).as_deref(),
        Some("len:10")
    );
    let seen = drained(&received);
    assert!(!seen.contains(&LARGE), "the backend got {seen:?}");
    eventually(PATIENCE, "the dropped datagram counted", || {
        let metrics = stack.metrics();
        let dropped = private_ingress_tests::live::sample(
            &metrics,
            "private_ingress_udp_datagrams_too_large_total",
        )?;
        (dropped >= 1.0).then_some(())
    });

    // Raised by an edit: the running listener forwards it.
    stack.write_workspace(&stack.workspace_text_of(&routes(", max_datagram_size = 2048"), ""));
    let raised_client = client();
    let answer = eventually(PATIENCE, "the large datagram once the edit applied", || {
        udp_answer(&raised_client, narrow, LARGE)
    });
    assert_eq!(answer, format!("len:{LARGE}"));
}

/// A UDP backend that answers each datagram with its name; with `tcp`, it also accepts TCP
/// connections on the same port number, as a DNS server does.
fn named_udp_backend(name: &'static str, tcp: bool) -> (SocketAddr, Option<TcpListener>) {
    loop {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let address = socket.local_addr().unwrap();
        let listener = if tcp {
            // The TCP port of the same number may be taken: try another.
            match TcpListener::bind(address) {
                Ok(listener) => Some(listener),
                Err(_) => continue,
            }
        } else {
            None
        };
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((_, from)) = socket.recv_from(&mut buf) {
                let _ = socket.send_to(name.as_bytes(), from);
            }
        });
        return (address, listener);
    }
}

/// A `'udp` route's `'tcp` health check: sozu probes each backend's port over TCP, shows the
/// backend that does not accept `down` and sends it no new flow; the one that answers on TCP
/// beside UDP takes them all.
#[test]
fn a_udp_route_health_check_takes_a_backend_without_its_tcp_port_out_of_rotation() {
    let (dns, _tcp) = named_udp_backend("dns", true);
    let (mute, _) = named_udp_backend("mute", false);
    let mut stack = Stack::new();
    let listen = free_port();
    let route = format!(
        "{{ host = \"dns.in.example.org\", protocol = 'udp, listen_port = {listen}, upstreams = [\
         {{ upstream = \"{}\", port = {} }}, {{ upstream = \"{}\", port = {} }}], \
         health = {{ mode = 'tcp, interval = 1, timeout = 1, healthy_threshold = 1, unhealthy_threshold = 1 }} }}",
        dns.ip(),
        dns.port(),
        mute.ip(),
        mute.port()
    );
    stack.write_workspace(&stack.workspace_text_of(&[route], ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    let health_of = |address: SocketAddr| {
        let state = stack.state()?;
        route_of(&state, "dns.in.example.org")?["upstreams"]
            .as_array()?
            .iter()
            .flat_map(|u| u["backends"].as_array().cloned().unwrap_or_default())
            .find(|b| b["address"] == address.to_string().as_str())?["health"]
            .as_str()
            .map(str::to_owned)
    };
    eventually(
        PATIENCE,
        "the backend without a TCP port shown down",
        || (health_of(mute)? == "down").then_some(()),
    );
    // sozu reports a change only: a backend healthy from the start stays `unknown`.
    assert_ne!(health_of(dns).as_deref(), Some("down"));
    // Each new client is a new flow: every one goes to the backend that passes.
    for flow in 0..10 {
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.set_read_timeout(Some(PATIENCE)).unwrap();
        client.send_to(b"query", ("127.0.0.1", listen)).unwrap();
        let mut buf = [0u8; 16];
        let (n, _) = client
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("flow {flow}: {e}"));
        assert_eq!(&buf[..n], b"dns", "flow {flow}");
    }
}

/// A `'udp` route's `limits.connections_per_ip` counts flows: a client address holding that
/// many (a flow per source port) has its next one dropped, counted in `/metrics`, and the
/// backend never sees it; the flows within the limit are answered.
#[test]
fn a_per_ip_limit_on_a_udp_route_drops_the_flow_past_it() {
    const LIMIT: usize = 2;
    let (upstream, received) = measuring_udp_backend();
    let mut stack = Stack::new();
    let listen = free_port();
    let routes = vec![port_route(
        "dns.in.example.org",
        "udp",
        listen,
        upstream,
        &format!(", limits.connections_per_ip = {LIMIT}"),
    )];
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(PATIENCE);
    let client = || {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.set_read_timeout(Some(PATIENCE)).unwrap();
        socket
    };
    // The first flow, once the route is in; then the second, within the limit.
    let first = client();
    first
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    eventually(PATIENCE, "a first flow", || udp_answer(&first, listen, 11));
    first.set_read_timeout(Some(PATIENCE)).unwrap();
    let second = client();
    assert_eq!(udp_answer(&second, listen, 12).as_deref(), Some("len:12"));
    // The third source port: dropped. Each flow then sends again and is answered, so the third
    // one's datagram, sent before, would have reached the backend first.
    let third = client();
    let _: Vec<usize> = received.try_iter().collect();
    third.send_to(&[b'x'; 13], ("127.0.0.1", listen)).unwrap();
    assert_eq!(udp_answer(&first, listen, 11).as_deref(), Some("len:11"));
    assert_eq!(udp_answer(&second, listen, 12).as_deref(), Some("len:12"));
    let seen: Vec<usize> = received.try_iter().collect();
    assert!(!seen.contains(&13), "the backend got {seen:?}");
    eventually(PATIENCE, "the dropped flow counted", || {
        let metrics = stack.metrics();
        let over = private_ingress_tests::live::sample(
            &metrics,
            "private_ingress_udp_flows_over_limit_total",
        )?;
        (over >= 1.0).then_some(())
    });
}

/// A port sozu cannot bind (another process holds it, without SO_REUSEPORT, so sozu's bind
/// fails rather than sharing it) is its route's problem: the agent is ready for the others
/// (`/readyz` 200, one route not served), the HTTPS route serves, and `/v1/state` and `status`
/// show the TCP route in error with sozu's reason. Once the port is free, the route's listener
/// is made at its next retry and the route carries connections.
#[test]
fn a_port_sozu_cannot_bind_is_its_routes_problem_not_the_agents() {
    let upstream = private_ingress_tests::live::echo_backend();
    let web = Backend::start("web");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), "app.in.example.org");
    let listen = free_port();
    // Held by another process's socket: std's listener sets SO_REUSEADDR, not SO_REUSEPORT.
    let holder = TcpListener::bind(("127.0.0.1", listen)).unwrap();
    let routes = vec![
        format!(
            "{{ host = \"app.in.example.org\", upstream = \"{}\", port = {} }}",
            web.address.ip(),
            web.address.port()
        ),
        port_route("db.in.example.org", "tcp", listen, upstream, ""),
    ];
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_sozu();
    stack.start_agent();
    let route_id = format!("pi-db.in.example.org-tcp-{listen}");
    let failing = eventually(PATIENCE, "the route in error", || {
        let state = stack.state()?;
        let route = state["routes"]
            .as_array()?
            .iter()
            .find(|r| r["id"] == route_id.as_str())?
            .clone();
        (route["state"] == "error").then_some(route)
    });
    let reason = failing["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.to_lowercase().contains("address already in use")
            || reason.contains(&listen.to_string()),
        "sozu's reason on the route: {failing}"
    );
    // The agent is ready for the route that can be served.
    stack.wait_ready(PATIENCE);
    let (code, body) = stack.readyz().unwrap();
    assert_eq!(
        (code, body.trim()),
        (200, "ready (1 route not served)"),
        "{body}"
    );
    let state = stack.state().unwrap();
    assert_eq!(state["readiness"]["routes_not_served"], 1, "{state}");
    assert_eq!(
        https_get(stack.https, "app.in.example.org", "/")
            .unwrap()
            .body,
        "web"
    );
    let status = stack.status_text();
    let row = status
        .lines()
        .find(|l| l.contains(&format!("tcp:{listen}")))
        .unwrap_or_else(|| panic!("no row for the route: {status}"));
    assert!(row.contains("error"), "{status}");
    assert!(
        status.starts_with("ready: yes (1 route not served)"),
        "{status}"
    );

    // The port freed: the next retry binds it, and the route carries connections. The retry
    // backs off (1 s, doubling per refusal): on a slow machine several refusals may have
    // passed, so the wait allows for a few doublings.
    drop(holder);
    eventually(
        3 * PATIENCE,
        "the route echoing once its port is free",
        || {
            let mut conn = TcpStream::connect(("127.0.0.1", listen)).ok()?;
            conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            conn.write_all(b"hello").ok()?;
            let mut buf = [0u8; 5];
            conn.read_exact(&mut buf).ok()?;
            (&buf == b"hello").then_some(())
        },
    );
    eventually(PATIENCE, "the route ok", || {
        let state = stack.state()?;
        let ok = state["routes"]
            .as_array()?
            .iter()
            .any(|r| r["id"] == route_id.as_str() && r["state"] == "ok");
        (ok && state["readiness"]["routes_not_served"] == 0).then_some(())
    });

    // An edit that puts a route on the agent's own admin port (this agent's --admin-address,
    // not the default 9180) is refused by `run` at its position; the last good workspace serves
    // on, and the admin API stays the agent's.
    let mut on_admin = routes.clone();
    on_admin.push(port_route(
        "cache.in.example.org",
        "tcp",
        stack.admin.port(),
        upstream,
        "",
    ));
    stack.write_workspace(&stack.workspace_text_of(&on_admin, ""));
    let error = eventually(PATIENCE, "the edit refused", || {
        stack.state()?["workspace"]["last_error"]
            .as_str()
            .filter(|e| {
                e.contains(&format!(
                    "routes[2]: listen_port {} is the agent's admin port",
                    stack.admin.port()
                ))
            })
            .map(str::to_owned)
    });
    assert!(
        error.contains("workspace.ncl:"),
        "with its position: {error}"
    );
    assert!(stack.ready(), "the last good workspace serves on");
}
