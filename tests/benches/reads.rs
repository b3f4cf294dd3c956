//! exploration
use private_ingress_tests::bench::reads::{self, Probe};
use private_ingress_tests::bench::{ours, workload::Pair};
use private_ingress_tests::live::Backend;
use std::time::Duration;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let backend = Backend::start("app");
    let pairs: Vec<Pair> = (0..n)
        .map(|i| Pair::new(&format!("s{i}.in.example.org")))
        .collect();
    let hosts: Vec<(String, &Pair)> = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("s{i}.in.example.org"), p))
        .collect();
    let o = ours::serve(&hosts, backend.address, "warn").expect("serve");
    let socket = o.stack.socket();
    let mut p = Probe::connect(&socket).unwrap();
    let show = |name: &str, c: &reads::Cost| {
        println!(
            "{name:50} {:>9.2} ms {:>10} B {:?}",
            c.took.as_secs_f64() * 1e3,
            c.bytes,
            c.error
        )
    };
    for _ in 0..2 {
        show("listeners", &p.ask(reads::listeners()));
        show(
            "frontends all",
            &p.ask(reads::frontends(None, None, true, true, true)),
        );
        show(
            "frontends http",
            &p.ask(reads::frontends(None, None, true, false, false)),
        );
        show(
            "frontends https",
            &p.ask(reads::frontends(None, None, false, true, false)),
        );
        show(
            "frontends tcp",
            &p.ask(reads::frontends(None, None, false, false, true)),
        );
        show(
            "frontends cluster pi-s7",
            &p.ask(reads::frontends(
                None,
                Some("pi-s7.in.example.org"),
                true,
                true,
                true,
            )),
        );
        show(
            "frontends domain s7.",
            &p.ask(reads::frontends(Some("s7."), None, true, true, false)),
        );
        show(
            "frontends domain s1",
            &p.ask(reads::frontends(Some("s1"), None, true, true, false)),
        );
        show("hashes", &p.ask(reads::hashes()));
        show("certs all", &p.ask(reads::certificates(None, None)));
        show(
            "certs fp",
            &p.ask(reads::certificates(None, Some(&pairs[7].fingerprint))),
        );
        show(
            "certs domain",
            &p.ask(reads::certificates(Some("s7.in.example.org"), None)),
        );
        show("certs workers", &p.ask(sozu_command_lib::proto::command::request::RequestType::QueryCertificatesFromWorkers(Default::default())));
        show(
            "cluster by id",
            &p.ask(
                sozu_command_lib::proto::command::request::RequestType::QueryClusterById(
                    "pi-s7.in.example.org".into(),
                ),
            ),
        );
    }
    let t = std::time::Instant::now();
    for i in 0..200 {
        p.ask(reads::frontends(
            None,
            Some(&format!("pi-s{i}.in.example.org")),
            true,
            true,
            true,
        ));
    }
    println!(
        "200 frontends by cluster: {:.2} ms each",
        t.elapsed().as_secs_f64() * 1e3 / 200.0
    );
    let t = std::time::Instant::now();
    for i in 0..200 {
        p.ask(reads::certificates(None, Some(&pairs[i].fingerprint)));
    }
    println!(
        "200 certs by fp: {:.2} ms each",
        t.elapsed().as_secs_f64() * 1e3 / 200.0
    );
    let t = std::time::Instant::now();
    for i in 0..20 {
        p.ask(reads::certificates(
            Some(&format!("s{i}.in.example.org")),
            None,
        ));
    }
    println!(
        "20 certs by domain: {:.2} ms each",
        t.elapsed().as_secs_f64() * 1e3 / 20.0
    );
    let t = std::time::Instant::now();
    for i in 0..100 {
        p.ask(
            sozu_command_lib::proto::command::request::RequestType::QueryClusterById(format!(
                "pi-s{i}.in.example.org"
            )),
        );
    }
    println!(
        "100 cluster by id: {:.2} ms each",
        t.elapsed().as_secs_f64() * 1e3 / 100.0
    );
    std::thread::sleep(Duration::from_millis(10));
}
