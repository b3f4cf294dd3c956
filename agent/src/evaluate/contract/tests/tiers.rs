//! The contract's fast tiers (routes checked at once) and its slow one (one by one) agree.

use super::*;

/// `routes` through `Routes` (the fast tiers) and through `Array (Route zone)` (one route at
/// a time): the exported value beside the type of each of its values (an enum tag and a
/// string export alike), or the diagnostic's message lines (source excerpts differ, as the
/// two annotations differ).
fn both_ways(routes: &str) -> [Result<serde_json::Value, String>; 2] {
    ["S.Routes zone", "Array (S.Route zone)"].map(|contract| {
            let main = format!(
                "{SCHEMA}\n|> (fun S => let zone = \"in.example.org\" in \
                 let rec kinds = fun v => if std.is_record v then std.record.map (fun _ x => kinds x) v \
                 else if std.is_array v then std.array.map kinds v else std.typeof v in \
                 {{ routes | {contract} = [{routes}], types = kinds routes }})\n"
            );
            let mut program: Program<CacheImpl> = ProgramBuilder::new()
                .add_source_string(main, "test")
                .build()
                .unwrap();
            match program.eval_full_for_export() {
                Ok(value) => Ok(serde_json::to_value(&value).unwrap()),
                Err(err) => {
                    let mut files = program.files();
                    let report = report_as_str(&mut files, err, ColorOpt::Never);
                    Err(report
                        .lines()
                        .filter(|l| !l.contains('│') && !l.contains('┌') && !l.contains('·'))
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .collect::<Vec<_>>()
                        .join("\n"))
                }
            }
        })
}

/// Valid routes using `drain`, `health`, `hsts` and `upstreams` in every form the fast tier
/// takes: each field with and without its defaults, modes as tags and as strings, upstreams
/// of each kind with and without weights and drains, and the fields together.
fn new_field_routes() -> Vec<String> {
    let h = |i: usize| format!("host = \"r{i}.in.example.org\"");
    [
            "upstream = \"svc.ns\", port = 80, drain = true",
            "upstream = \"svc.ns\", port = 80, drain = false",
            "upstream = \"unix:///run/app.sock\", drain = true",
            "upstream = \"FD00::10\", port = 443, hsts = true",
            "upstream = \"10.0.0.1\", port = 80, hsts = false",
            "upstream = \"svc.ns\", port = 80, hsts = {}",
            "upstream = \"svc.ns\", port = 80, hsts = { max_age = 0 }",
            "upstream = \"svc.ns\", port = 80, hsts = { include_subdomains = true }",
            "upstream = \"svc.ns\", port = 80, hsts = { preload = false, max_age = 4294967295 }",
            "upstream = \"svc.ns\", port = 80, hsts = { include_subdomains = true, preload = true }",
            "upstream = \"svc.ns\", port = 80, hsts = { include_subdomains = true, preload = true, max_age = 63072000 }",
            "upstream = \"svc.ns\", port = 80, health = {}",
            "upstream = \"svc.ns\", port = 80, health = { mode = 'http, path = \"/ready?full=1\", port = 9000 }",
            "upstream = \"svc.ns\", port = 80, health = { mode = \"http\", accepted_statuses = [204, \"200-399\", \"500-599\", 599] }",
            "upstream = \"svc.ns\", port = 80, health = { accepted_statuses = [] }",
            "upstream = \"svc.ns\", port = 80, health = { mode = 'tcp }",
            "upstream = \"svc.ns\", port = 80, health = { mode = \"tcp\", interval = 3600, timeout = 3600, healthy_threshold = 100, unhealthy_threshold = 1, port = 65535 }",
            "upstream = \"svc.ns\", port = 80, health = { interval = 5, timeout = 5 }",
            "upstream = \"svc.ns\", port = 80, health = { interval = 7 }",
            "upstream = \"svc.ns\", port = 80, health = { timeout = 10 }",
            "upstreams = [{ upstream = \"svc.ns\", port = 80 }]",
            "upstreams = [{ upstream = \"unix:///run/a.sock\", weight = 7 }]",
            "upstreams = [{ upstream = \"a.ns\", port = 80, weight = 255 }, { upstream = \"a.ns\", port = 81, weight = 1 }, { upstream = \"b.ns\", port = 80, drain = true }, { upstream = \"10.0.0.1\", port = 80 }, { upstream = \"10.0.0.2\", port = 80, drain = false }]",
            "upstreams = [{ upstream = \"FD00::10\", port = 443 }, { upstream = \"svc.ns\", port = 443 }]",
            "upstreams = [{ upstream = \"svc.ns\", port = 80 }, { upstream = \"unix:///run/a.sock\", drain = true, weight = 3 }, { upstream = \"other.ns\", port = 80 }]",
            "path_prefix = \"/api/\", upstream = \"svc.ns\", port = 80, drain = true",
            "path_prefix = \"/\", upstream = \"svc.ns\", port = 80, hsts = false",
            "path_prefix = \"/app\", drain = true, hsts = { max_age = 86400 }, health = { mode = 'tcp, port = 5432, interval = 30, timeout = 3 }, upstreams = [{ upstream = \"app.ns\", port = 5432, weight = 9 }, { upstream = \"app-next.ns\", port = 5432, drain = true }]",
        ]
        .iter()
        .enumerate()
        .map(|(i, fields)| format!("{{ {}, {fields} }}", h(i)))
        .collect()
}

/// The fast tier gives every valid route using the newer fields the values `Route zone`
/// gives it: the same exported values (and enum tags where it gives tags), alone and all in
/// one array; the same model of a whole workspace as the contract without its fast tiers,
/// with them alone and among routes written the old way, every route having taken the fast
/// tier; and, in an array with a mistake, each valid route still takes it, on its own.
#[test]
fn new_field_routes_take_the_fast_tier_with_the_values_of_the_slow_one() {
    let routes = new_field_routes();
    for route in &routes {
        let [fast, precise] = both_ways(route);
        assert!(fast.is_ok(), "{route}: {fast:?}");
        assert_eq!(fast, precise, "{route}");
    }
    let [fast, precise] = both_ways(&routes.join(", "));
    assert_eq!(fast, precise);

    let old_form = [
            "{ host = \"old-a.in.example.org\", upstream = \"svc.ns\", port = 80 }",
            "{ host = \"old-b.in.example.org\", upstream = \"unix:///run/old.sock\", path_prefix = \"/old/\" }",
        ];
    let dir = tempfile::tempdir().unwrap();
    for (name, all) in [
        ("new-fields.ncl", routes.clone()),
        (
            "mixed.ncl",
            std::iter::once(old_form[0].to_owned())
                .chain(routes.iter().cloned())
                .chain(std::iter::once(old_form[1].to_owned()))
                .collect(),
        ),
    ] {
        let path = write(
            &dir,
            name,
            &format!(
                "{{ zone = \"in.example.org\", cluster_issuer = \"ca\", routes = [\n{}\n] }}",
                all.join(",\n")
            ),
        );
        let (fast, tiers) = evaluate_tracing(&path, Target::Agent);
        let slow = evaluate_with(
            &Input::File(path.clone()),
            None,
            Target::Agent,
            DEFAULT_ADMIN_PORT,
            &WITHOUT_FAST_TIERS,
            std::io::sink(),
            Afterwards::Free,
        );
        assert_eq!(fast.unwrap(), slow.unwrap(), "{name}");
        assert_eq!(
            tiers,
            Tiers {
                plain: 0,
                fast: all.len(),
                slow: 0
            },
            "{name}"
        );
    }

    // Beside a mistake, the array is checked route by route: the valid ones on the fast tier.
    // (Valid routes on both sides of it, since evaluation stops at the mistake and need not
    // go in order.)
    let others: Vec<_> = routes
        .iter()
        .map(|r| r.replacen("host = \"r", "host = \"s", 1))
        .collect();
    let path = write(
        &dir,
        "mistake.ncl",
        &format!(
            "{{ zone = \"in.example.org\", cluster_issuer = \"ca\", routes = [\n{},\n\
                 {{ host = \"bad.in.example.org\", upstream = \"svc.ns\", port = 0 }},\n{}\n] }}",
            routes.join(",\n"),
            others.join(",\n")
        ),
    );
    let (refused, tiers) = evaluate_tracing(&path, Target::Agent);
    assert!(
        matches!(&refused, Err(ContractError::Invalid { diagnostic }) if diagnostic.contains("port 0 is out of range")),
        "{refused:?}"
    );
    assert_eq!((tiers.plain, tiers.slow), (0, 1), "{tiers:?}");
    assert!(tiers.fast >= routes.len(), "{tiers:?}");
}

/// The fast checks are stricter than `Route`, never looser: every route gets the same
/// verdict (and, refused, the same message, and accepted, the same values) either way, alone
/// and next to a good one (which, beside a route with the other fields, is checked at once with
/// it, and beside a mistake, alone).
#[test]
fn routes_checked_at_once_or_one_by_one_agree() {
    let long_label = "a".repeat(63);
    let long_host = format!("{0}.{0}.{0}.{1}.in.example.org", long_label, "b".repeat(46));
    let too_long_host = format!("c{long_host}");
    let long_upstream = format!("{0}.{0}.{0}.{1}", long_label, "b".repeat(61));
    let too_long_upstream = format!("c{long_upstream}");
    assert_eq!((long_host.len(), long_upstream.len()), (253, 253));
    let cases = [
            // Accepted.
            r#"{ host = "a.in.example.org", upstream = "10.0.0.1", port = 80 }"#.to_owned(),
            r#"{ host = "in.example.org", upstream = "svc.ns.svc.cluster.local", port = 65535, path_prefix = "/api/" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "FD00::10", port = 1 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "unix:///run/app.sock" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "unix:///run/a b/app.sock" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "svc.1abc", port = 80 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, path_prefix = "/a\"b\\c" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, path_prefix = "/é" }"#.into(),
            format!(r#"{{ host = "{long_host}", upstream = "{long_upstream}", port = 80 }}"#),
            // Accepted, with the fields beyond `upstream` and `port`.
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, drain = true }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "x", port = 80, weight = 2 }, { upstream = "unix:///run/a.sock", drain = true }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "fd00::1", port = 80 }, { upstream = "fd00::1", port = 81 }, { upstream = "fd00::2", port = 80 }] }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = {}, hsts = false }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { mode = "tcp", timeout = 10, interval = 10 }, hsts = true }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { accepted_statuses = [301, "200-299"] }, hsts = { max_age = 60 } }"#.into(),
            r#"{ host = "a.in.example.org", path_prefix = "/api", upstream = "svc.1abc", port = 80, drain = false }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 50051, upstream_protocol = 'h2c, health = { mode = 'tcp } }"#.into(),
            // Refused.
            r#"{ host = "a.in.example.org", upstream = "x", port = 50051, upstream_protocol = 'grpc }"#.into(),
            r#"{ host = "a.in.example.org", redirect = { host = "b.in.example.org" }, upstream_protocol = "h2c" }"#.into(),
            r#"{ host = "a.example.org", upstream = "x", port = 80, upstream_protocol = 'h2c }"#.into(),
            format!(r#"{{ host = "{too_long_host}", upstream = "x", port = 80 }}"#),
            format!(r#"{{ host = "a.in.example.org", upstream = "{too_long_upstream}", port = 80 }}"#),
            r#"{ host = "a.example.org", upstream = "x", port = 80 }"#.into(),
            r#"{ host = "A.in.example.org", upstream = "x", port = 80 }"#.into(),
            r#"{ host = "a.in.example.org.", upstream = "x", port = 80 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "http://x", port = 80 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x:80", port = 80 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "[::1]", port = 80 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "10.0.0.300", port = 80 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "unix:///run/app.sock", port = 80 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "unix://run/app.sock" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 0 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 65536 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80.5 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = "80" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = null }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, weight = 1 }"#.into(),
            r#"{ host = "a.in.example.org", port = 80 }"#.into(),
            r#"{ host = null, upstream = "x", port = 80 }"#.into(),
            r#"{ host = 'a, upstream = "x", port = 80 }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, path_prefix = "api" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, path_prefix = "/a b" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, path_prefix = "/a?b" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, path_prefix = "/a\nb" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, drain = "yes" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", upstreams = [{ upstream = "y", port = 80 }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = "x" }"#.into(),
            r#"{ host = "a.in.example.org", port = 80, upstreams = [{ upstream = "y" }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "y" }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = ["y"] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "y", port = 80, weight = 0 }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "y", port = 80, weight = 256 }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "y", port = 80, weight = 1.5 }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "y", port = 80, weihgt = 2 }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "y", port = 80 }, { upstream = "y", port = 80 }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "fd00::1", port = 80 }, { upstream = "FD00:0:0::1", port = 80 }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "unix:///a.sock" }, { upstream = "unix:///b.sock" }] }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "http://y", port = 80 }] }"#.into(),
            r#"{ host = "a.example.org", upstreams = [{ upstream = "y", port = 80 }] }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { timeout = 20 } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { mode = 'tcp, accepted_statuses = [] } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { mode = "udp" } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { path = "healthz" } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { accepted_statuses = ["2xx"] } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { accepted_statuses = ["500-200"] } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { healthy_threshold = 101 } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { pth = "/" } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = true }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, hsts = { preload = true, include_subdomains = true, max_age = 86400 } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, hsts = { max_age = 1.5 } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, hsts = { maxage = 1 } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, hsts = "on" }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { accepted_statuses = [204, '"200-299"] } }"#.into(),
            r#"{ host = "a.in.example.org", upstream = "x", port = 80, health = { mode = "tcp", timeout = 20, interval = 10 } }"#.into(),
            r#"{ host = "a.in.example.org", upstreams = [{ upstream = "y", port = 80, weight = 2 }, { upstream = "z", port = 80 }, { upstream = "y", port = 80, drain = true }] }"#.into(),
            // A second route smuggled into the host as JSON text.
            r#"{ host = "a.in.example.org\", \"port\": 80, \"upstream\": \"x\"}, {\"host\": \"b.in.example.org", upstream = "x", port = 80 }"#.into(),
            "[]".into(),
        ];
    // The cases above `// Refused.`
    let accepted = 17;
    let good = r#"{ host = "ok.in.example.org", upstream = "10.0.0.9", port = 443 }"#;
    for (i, case) in cases.iter().enumerate() {
        for routes in [case.clone(), format!("{good}, {case}")] {
            let [fast, precise] = both_ways(&routes);
            assert_eq!(fast, precise, "routes [{routes}]");
            assert_eq!(fast.is_ok(), i < accepted, "routes [{routes}]: {fast:?}");
        }
    }
    // The one difference: JSON writes an enum tag as a string, so a tag that reads as a valid
    // host, upstream or health check path passes the fast check and is refused by `String`
    // instead, pointing at the same field without `Route`'s explanation. (A tag among the
    // accepted statuses is handed to `Health`, and a mode may be a tag.)
    for (name, fields) in [
        (
            "host",
            r#"host = '"a.in.example.org", upstream = "x", port = 80"#,
        ),
        (
            "upstream",
            r#"host = "a.in.example.org", upstream = 'x, port = 80"#,
        ),
        (
            "upstream",
            r#"host = "a.in.example.org", upstreams = [{ upstream = 'x, port = 80 }]"#,
        ),
        (
            "upstream",
            r#"host = "a.in.example.org", upstream = 'x, port = 80, drain = true"#,
        ),
        (
            "path",
            r#"host = "a.in.example.org", upstream = "x", port = 80, health = { path = '"/healthz" }"#,
        ),
    ] {
        let [fast, precise] = both_ways(&format!("{{ {fields} }}"));
        for refused in [&fast, &precise] {
            assert!(
                matches!(refused, Err(m) if m.contains(&format!("broken by the value of `{name}`"))),
                "{fields}: {refused:?}"
            );
        }
    }
}
