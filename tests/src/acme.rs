//! Real servers for the ACME tests, on loopback with ports the test picks: pebble (an ACME CA)
//! with its own TLS certificate, pebble-challtestsrv (a DNS server whose TXT records are set over
//! HTTP), BIND (`named`, RFC 2136 updates with a TSIG key and an update-policy limited to TXT),
//! and a stand-in for Cloudflare's v4 API that publishes through pebble-challtestsrv. Each is
//! killed on drop; none depends on a server of the system (Debian's bind9 may run one on port 53:
//! it is never asked).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::live::{eventually, free_port, Process};

/// A binary the ACME tests need; CI installs it (scripts/test), so a missing one fails the test.
pub fn require(binary: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"] {
        let path = Path::new(dir).join(binary);
        if path.is_file() {
            return path;
        }
    }
    panic!("{binary} is not installed: scripts/test installs it (apt-get install pebble bind9 bind9-dnsutils)");
}

/// A free UDP and TCP port on 127.0.0.1 (DNS servers listen on both).
fn free_dns_port() -> u16 {
    loop {
        let port = free_port();
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A throwaway CA and a certificate for 127.0.0.1/localhost (and another address, when the
/// server listens there) signed by it: pebble's own TLS, and the Cloudflare stand-in's.
pub struct Pki {
    pub ca_pem: PathBuf,
    pub cert_pem: PathBuf,
    pub key_pem: PathBuf,
}

impl Pki {
    pub fn create(dir: &Path) -> Pki {
        Pki::create_named(dir, "pebble")
    }

    /// A PKI of its own for the server `name`, its files named after it.
    pub fn create_named(dir: &Path, name: &str) -> Pki {
        Pki::create_for(dir, name, Ipv4Addr::LOCALHOST)
    }

    /// [`Pki::create_named`] for a server that listens at `ip` as well.
    pub fn create_for(dir: &Path, name: &str, ip: Ipv4Addr) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test TLS CA"));
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        leaf.subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        if !ip.is_loopback() {
            leaf.subject_alt_names.push(SanType::IpAddress(ip.into()));
        }
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        let pki = Pki {
            ca_pem: dir.join(format!("{name}-ca.pem")),
            cert_pem: dir.join(format!("{name}-cert.pem")),
            key_pem: dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&pki.ca_pem, ca_cert.pem()).unwrap();
        std::fs::write(&pki.cert_pem, cert.pem()).unwrap();
        std::fs::write(&pki.key_pem, key.serialize_pem()).unwrap();
        pki
    }
}

/// The ACME CA.
pub struct Pebble {
    pub directory: String,
    pub listen: SocketAddr,
    pub management: SocketAddr,
    pub ca_pem: PathBuf,
    config: PathBuf,
    dns: SocketAddr,
    log: PathBuf,
    process: Option<Process>,
}

impl Pebble {
    /// Starts pebble validating DNS-01 against `dns`, without validation sleeps and without
    /// reusing authorisations (so every order exercises DNS).
    pub fn start(dir: &Path, dns: SocketAddr) -> Pebble {
        Pebble::start_at(dir, dns, Ipv4Addr::LOCALHOST)
    }

    /// [`Pebble::start`] listening at `ip` (an address of the calling thread's network).
    pub fn start_at(dir: &Path, dns: SocketAddr, ip: Ipv4Addr) -> Pebble {
        require("pebble");
        let pki = Pki::create_for(dir, "pebble", ip);
        let listen = SocketAddr::from((ip, free_port()));
        let management = SocketAddr::from((ip, free_port()));
        let config = dir.join("pebble-config.json");
        let text = serde_json::json!({
            "pebble": {
                "listenAddress": listen.to_string(),
                "managementListenAddress": management.to_string(),
                "certificate": pki.cert_pem,
                "privateKey": pki.key_pem,
                "httpPort": free_port(),
                "tlsPort": free_port(),
                "ocspResponderURL": "",
                "externalAccountBindingRequired": false,
            }
        });
        std::fs::write(&config, text.to_string()).unwrap();
        let mut pebble = Pebble {
            directory: format!("https://{listen}/dir"),
            listen,
            management,
            ca_pem: pki.ca_pem,
            config,
            dns,
            log: dir.join("pebble.log"),
            process: None,
        };
        pebble.resume();
        pebble
    }

    /// Starts pebble again on the same ports (a new CA: its state is lost, as after any restart).
    pub fn resume(&mut self) {
        let mut cmd = Command::new("pebble");
        cmd.arg("-config")
            .arg(&self.config)
            .arg("-dnsserver")
            .arg(self.dns.to_string())
            .arg("-strict=false")
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_AUTHZREUSE", "0");
        let previous = std::fs::read_to_string(&self.log).unwrap_or_default();
        std::fs::write(self.log.with_extension("previous.log"), previous).ok();
        self.process = Some(Process::spawn(&mut cmd, &self.log));
        // Pebble makes its root and intermediate keys first: seconds on a loaded machine.
        let (listen, management) = (self.listen, self.management);
        eventually(Duration::from_secs(60), "pebble listening", || {
            TcpStream::connect(listen)
                .and_then(|_| TcpStream::connect(management))
                .ok()
                .map(|_| ())
        });
    }

    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// How many certificates this pebble has issued since it (last) started, as its log says:
    /// the orders the CA saw through, whoever placed them.
    pub fn issued(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches("Issued certificate serial")
            .count()
    }

    /// The root that signs the certificates this pebble issues (new on every start).
    pub fn root_pem(&self) -> String {
        https_text(self.management, "/roots/0", &self.ca_pem)
    }
}

/// One HTTPS GET to `address`, trusting `ca_pem` only.
fn https_text(address: SocketAddr, path: &str, ca_pem: &Path) -> String {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls::pki_types::CertificateDer::pem_file_iter(ca_pem).unwrap() {
        roots.add(der.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::from(address.ip());
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut sock = TcpStream::connect(address).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    tls.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            address.ip()
        )
        .as_bytes(),
    )
    .unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response).into_owned();
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// pebble-challtestsrv: a DNS server whose TXT records are set and cleared over HTTP.
pub struct Challtestsrv {
    pub dns: SocketAddr,
    pub management: SocketAddr,
    _process: Process,
}

impl Challtestsrv {
    pub fn start(dir: &Path) -> Challtestsrv {
        require("pebble-challtestsrv");
        let dns = SocketAddr::from(([127, 0, 0, 1], free_dns_port()));
        let management = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cmd = Command::new("pebble-challtestsrv");
        cmd.args([
            "-http01",
            "",
            "-https01",
            "",
            "-tlsalpn01",
            "",
            "-defaultIPv6",
            "",
        ])
        .arg("-dns01")
        .arg(dns.to_string())
        .arg("-management")
        .arg(management.to_string())
        .args(["-defaultIPv4", "127.0.0.1"]);
        let process = Process::spawn(&mut cmd, &dir.join("challtestsrv.log"));
        eventually(Duration::from_secs(10), "challtestsrv listening", || {
            TcpStream::connect(management).ok().map(|_| ())
        });
        Challtestsrv {
            dns,
            management,
            _process: process,
        }
    }

    pub fn set_txt(&self, name: &str, value: &str) {
        post(
            self.management,
            "/set-txt",
            &serde_json::json!({ "host": fqdn(name), "value": value }),
        );
    }

    pub fn clear_txt(&self, name: &str) {
        post(
            self.management,
            "/clear-txt",
            &serde_json::json!({ "host": fqdn(name) }),
        );
    }
}

fn fqdn(name: &str) -> String {
    format!("{}.", name.trim_end_matches('.'))
}

fn post(address: SocketAddr, path: &str, body: &serde_json::Value) {
    ureq::post(&format!("http://{address}{path}"))
        .send(body.to_string())
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
}

/// A zone BIND serves: its name, extra records (zone-file lines), and whether the TSIG key may
/// add and remove TXT records in it.
pub struct Zone {
    pub name: String,
    pub records: Vec<String>,
    pub updatable: bool,
}

/// BIND 9 as a primary server on 127.0.0.1 (or another address), with the TSIG key `acme-key`.
pub struct Bind {
    pub address: SocketAddr,
    /// The key's secret, base64, as `tsig-keygen` printed it.
    pub secret: String,
    _process: Process,
}

impl Bind {
    pub fn start(dir: &Path, zones: &[Zone]) -> Bind {
        Bind::start_at(dir, zones, Ipv4Addr::LOCALHOST)
    }

    /// [`Bind::start`] listening at `ip` (an address of the calling thread's network) too.
    pub fn start_at(dir: &Path, zones: &[Zone], ip: Ipv4Addr) -> Bind {
        let named = require("named");
        let keygen = require("tsig-keygen");
        let dir = dir.join("named");
        std::fs::create_dir_all(&dir).unwrap();
        let key = Command::new(keygen)
            .args(["-a", "hmac-sha256", "acme-key"])
            .output()
            .expect("run tsig-keygen");
        let key = String::from_utf8_lossy(&key.stdout).into_owned();
        let secret = key
            .split("secret \"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("a secret in tsig-keygen's output")
            .to_owned();
        let port = free_dns_port();
        let also = if ip.is_loopback() {
            String::new()
        } else {
            format!("{ip}; ")
        };
        let mut conf = format!(
            "options {{\n  directory \"{dir}\";\n  pid-file \"{dir}/named.pid\";\n  \
             listen-on port {port} {{ 127.0.0.1; {also}}};\n  listen-on-v6 {{ none; }};\n  \
             recursion yes;\n  allow-recursion {{ 127.0.0.1; {also}}};\n  notify no;\n  \
             dnssec-validation no;\n  allow-query {{ any; }};\n}};\n\
             controls {{ }};\n{key}\n\
             zone \".\" {{\n  type primary;\n  file \"{dir}/root.zone\";\n}};\n",
            dir = dir.display()
        );
        // pebble uses this server as its resolver, and a CA's resolver follows CNAMEs into other
        // zones: recursion is on for loopback. A root zone of its own keeps every answer local
        // (a name outside the test's zones does not exist, and nothing is asked of the Internet).
        std::fs::write(
            dir.join("root.zone"),
            "$TTL 60\n@ IN SOA ns1.test-root. hostmaster.test-root. 1 60 60 3600 60\n@ IN NS ns1.test-root.\nns1.test-root. IN A 127.0.0.1\n",
        )
        .unwrap();
        for zone in zones {
            let file = dir.join(format!("{}.zone", zone.name));
            let mut text = format!(
                "$TTL 60\n@ IN SOA ns1.{0}. hostmaster.{0}. 1 60 60 3600 60\n@ IN NS ns1.{0}.\nns1 IN A 127.0.0.1\n",
                zone.name
            );
            for record in &zone.records {
                text.push_str(record);
                text.push('\n');
            }
            std::fs::write(&file, text).unwrap();
            conf.push_str(&format!(
                "zone \"{}\" {{\n  type primary;\n  file \"{}\";\n{}}};\n",
                zone.name,
                file.display(),
                if zone.updatable {
                    "  update-policy { grant acme-key zonesub TXT; };\n"
                } else {
                    ""
                }
            ));
        }
        let conf_path = dir.join("named.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let mut cmd = Command::new(named);
        cmd.arg("-g").arg("-c").arg(&conf_path);
        let process = Process::spawn(&mut cmd, &dir.join("../named.log"));
        let address = SocketAddr::from((ip, port));
        let first = zones.first().map(|z| z.name.clone()).unwrap_or_default();
        eventually(Duration::from_secs(15), "named answering", || {
            (!dig(address, &first, "SOA").is_empty()).then_some(())
        });
        Bind {
            address,
            secret,
            _process: process,
        }
    }
}

/// `dig @server name type +short`: the answers, one per line (TXT values without quotes).
pub fn dig(server: SocketAddr, name: &str, rtype: &str) -> Vec<String> {
    let output = Command::new(require("dig"))
        .arg(format!("@{}", server.ip()))
        .args([
            "-p",
            &server.port().to_string(),
            name,
            rtype,
            "+short",
            "+time=1",
            "+tries=1",
        ])
        .output()
        .expect("run dig");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .map(|l| l.trim().trim_matches('"').to_owned())
        .collect()
}

/// What the Cloudflare stand-in was asked, for assertions.
#[derive(Debug, Default, Clone)]
pub struct CloudflareLog {
    /// `METHOD path` of every call.
    pub calls: Vec<String>,
    /// Calls without the expected `Authorization: Bearer <token>`.
    pub unauthorized: usize,
}

/// An HTTPS server implementing the Cloudflare v4 endpoints the agent uses (zone lookup, create,
/// list and delete DNS records), as documented, publishing the TXT records through
/// pebble-challtestsrv so that pebble sees them. Like the real API it speaks HTTPS only, with a
/// certificate from a CA of its own ([`CloudflareStandIn::ca_pem`]), which the agent is told
/// to trust the way a user would tell it: `SSL_CERT_FILE`.
pub struct CloudflareStandIn {
    pub url: String,
    /// The CA of the stand-in's certificate.
    pub ca_pem: PathBuf,
    pub log: Arc<Mutex<CloudflareLog>>,
    /// Records held, by id: (name, content).
    pub records: Arc<Mutex<BTreeMap<String, (String, String)>>>,
    stop: Arc<AtomicBool>,
}

impl CloudflareStandIn {
    pub fn start(
        dir: &Path,
        token: &str,
        zones: &[&str],
        dns: Arc<Challtestsrv>,
    ) -> CloudflareStandIn {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let pki = Pki::create_named(dir, "cloudflare");
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_file(&pki.cert_pem).unwrap()],
            PrivateKeyDer::from_pem_file(&pki.key_pem).unwrap(),
        )
        .unwrap();
        let tls = Arc::new(tls);
        let listener = TcpListener::bind(("127.0.0.1", free_port())).unwrap();
        let url = format!("https://{}/client/v4", listener.local_addr().unwrap());
        listener.set_nonblocking(true).unwrap();
        let stand_in = CloudflareStandIn {
            url,
            ca_pem: pki.ca_pem.clone(),
            log: Arc::default(),
            records: Arc::default(),
            stop: Arc::default(),
        };
        let state = Api {
            token: token.to_owned(),
            zones: zones
                .iter()
                .enumerate()
                .map(|(i, z)| (format!("zone{i:04}"), (*z).to_owned()))
                .collect(),
            dns,
            log: stand_in.log.clone(),
            records: stand_in.records.clone(),
            next_record: Default::default(),
        };
        let stop = stand_in.stop.clone();
        std::thread::spawn(move || {
            let state = Arc::new(state);
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let state = state.clone();
                        let tls = tls.clone();
                        std::thread::spawn(move || {
                            let _ = stream.set_nonblocking(false);
                            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                            let Ok(connection) = rustls::ServerConnection::new(tls) else {
                                return;
                            };
                            state.serve(rustls::StreamOwned::new(connection, stream));
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        stand_in
    }
}

impl Drop for CloudflareStandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Api {
    token: String,
    /// id → name.
    zones: BTreeMap<String, String>,
    dns: Arc<Challtestsrv>,
    log: Arc<Mutex<CloudflareLog>>,
    records: Arc<Mutex<BTreeMap<String, (String, String)>>>,
    next_record: std::sync::atomic::AtomicU64,
}

impl Api {
    fn serve(&self, mut stream: impl Read + Write) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        buf.extend_from_slice(&chunk[..n]);
                        continue;
                    }
                }
            };
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + length {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).into_owned();
            buf.drain(..end + 4 + length);
            let (status, answer) = self.answer(&head, &body);
            let text = answer.to_string();
            let response = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
                text.len()
            );
            if stream.write_all(response.as_bytes()).is_err() || stream.flush().is_err() {
                return;
            }
        }
    }

    fn answer(&self, head: &str, body: &str) -> (u16, serde_json::Value) {
        use serde_json::json;
        let request_line = head.lines().next().unwrap_or_default();
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let target = parts.next().unwrap_or_default();
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let path = path.strip_prefix("/client/v4").unwrap_or(path).to_owned();
        let query: BTreeMap<String, String> = query
            .split('&')
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (decode(k), decode(v)))
            .collect();
        let authorized = head.lines().any(|l| {
            l.split_once(':').is_some_and(|(k, v)| {
                k.eq_ignore_ascii_case("authorization")
                    && v.trim() == format!("Bearer {}", self.token)
            })
        });
        {
            let mut log = self.log.lock().unwrap();
            log.calls.push(format!("{method} {path}"));
            if !authorized {
                log.unauthorized += 1;
            }
        }
        let fail = |status: u16, code: i64, message: &str| {
            (
                status,
                json!({ "success": false, "errors": [{ "code": code, "message": message }], "messages": [], "result": null }),
            )
        };
        let ok = |result: serde_json::Value| {
            (
                200,
                json!({ "success": true, "errors": [], "messages": [], "result": result }),
            )
        };
        if !authorized {
            return fail(403, 10000, "Authentication error");
        }
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (method.as_str(), segments.as_slice()) {
            ("GET", ["zones"]) => {
                let name = query.get("name").cloned().unwrap_or_default();
                let found: Vec<_> = self
                    .zones
                    .iter()
                    .filter(|(_, z)| **z == name)
                    .map(|(id, z)| json!({ "id": id, "name": z, "status": "active" }))
                    .collect();
                ok(json!(found))
            }
            ("POST", ["zones", zone, "dns_records"]) if self.zones.contains_key(*zone) => {
                let record: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
                let (Some(kind), Some(name), Some(content)) = (
                    record["type"].as_str(),
                    record["name"].as_str(),
                    record["content"].as_str(),
                ) else {
                    return fail(400, 9000, "type, name and content are required");
                };
                if kind != "TXT" {
                    return fail(400, 9000, "only TXT records in this stand-in");
                }
                let id = self.next_record.fetch_add(1, Ordering::Relaxed) + 1;
                let record_id = format!("rec{id:06}");
                self.records
                    .lock()
                    .unwrap()
                    .insert(record_id.clone(), (name.to_owned(), content.to_owned()));
                self.dns.set_txt(name, content);
                ok(
                    json!({ "id": record_id, "type": "TXT", "name": name, "content": content, "ttl": record["ttl"] }),
                )
            }
            ("GET", ["zones", zone, "dns_records"]) if self.zones.contains_key(*zone) => {
                let records = self.records.lock().unwrap();
                let found: Vec<_> = records
                    .iter()
                    .filter(|(_, (name, content))| {
                        query.get("type").is_none_or(|t| t == "TXT")
                            && query.get("name").is_none_or(|n| n == name)
                            && query.get("content").is_none_or(|c| c == content)
                    })
                    .map(|(id, (name, content))| json!({ "id": id, "type": "TXT", "name": name, "content": content }))
                    .collect();
                ok(json!(found))
            }
            ("DELETE", ["zones", zone, "dns_records", record])
                if self.zones.contains_key(*zone) =>
            {
                let mut records = self.records.lock().unwrap();
                let Some((name, _)) = records.remove(*record) else {
                    return fail(404, 81044, "Record does not exist.");
                };
                // challtestsrv clears every value of a name: put back the others.
                self.dns.clear_txt(&name);
                for (other, content) in records.values() {
                    if *other == name {
                        self.dns.set_txt(other, content);
                    }
                }
                ok(json!({ "id": record }))
            }
            _ => fail(404, 7003, "Could not route to this path"),
        }
    }
}

/// Percent-decoding of a query component.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
