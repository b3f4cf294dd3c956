//! Which host names a certificate's DNS names cover, as a TLS client decides it: what serves a
//! pair named by path (`certificates`) for every route host it covers. Pure.

/// Whether the DNS subject alternative name `san` covers `host`, as webpki (the check rustls
/// clients run) decides it: the same name, letter case aside; or a `*.` wildcard standing for
/// exactly one whole leftmost label (`*.example.org` covers `a.example.org`, neither
/// `example.org` nor `a.b.example.org`). A wildcard anywhere else (`a*.example.org`, `*.*.org`)
/// or over a single label (`*.org`) covers nothing.
pub fn covers(san: &str, host: &str) -> bool {
    let (san, host) = (san.trim_end_matches('.'), host.trim_end_matches('.'));
    if san.is_empty() || host.is_empty() {
        return false;
    }
    match san.strip_prefix("*.") {
        None => !san.contains('*') && san.eq_ignore_ascii_case(host),
        Some(parent) => {
            if parent.contains('*') || !parent.contains('.') {
                return false;
            }
            match host.split_once('.') {
                Some((label, rest)) => {
                    !label.is_empty() && !label.contains('*') && rest.eq_ignore_ascii_case(parent)
                }
                None => false,
            }
        }
    }
}

/// How well `sans` name `host`: an exact name beats a wildcard (as Traefik and sozu pick a
/// certificate for a name: the exact one first); `None` when none covers it.
pub fn match_of(sans: &[String], host: &str) -> Option<Match> {
    let mut best = None;
    for san in sans {
        if covers(san, host) {
            let this = if san.starts_with("*.") {
                Match::Wildcard
            } else {
                Match::Exact
            };
            best = best.max(Some(this));
        }
    }
    best
}

/// How a certificate names a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Match {
    Wildcard,
    Exact,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_covers_one_whole_label_and_names_compare_without_case() {
        let cases = [
            ("a.example.org", "a.example.org", true),
            ("A.Example.ORG", "a.example.org", true),
            ("a.example.org.", "a.example.org", true),
            ("a.example.org", "b.example.org", false),
            ("*.example.org", "a.example.org", true),
            ("*.example.org", "A-1.EXAMPLE.org", true),
            ("*.example.org", "example.org", false),
            ("*.example.org", "a.b.example.org", false),
            ("*.example.org", ".example.org", false),
            ("*.example.org", "a.example.com", false),
            ("*.org", "example.org", false),
            ("a*.example.org", "ab.example.org", false),
            ("*.*.example.org", "a.b.example.org", false),
            ("b.*.example.org", "b.a.example.org", false),
            ("", "a.example.org", false),
            ("*.", "a", false),
        ];
        for (san, host, expected) in cases {
            assert_eq!(covers(san, host), expected, "{san} covers {host}");
        }
    }

    /// The rule above is webpki's: the same answers for the same names, with the certificate a
    /// client would get.
    #[test]
    fn the_rule_is_the_one_tls_clients_apply() {
        let sans = ["*.in.example.org", "exact.other.example.org"];
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let der = params.self_signed(&key).unwrap().der().clone();
        let cert = webpki::EndEntityCert::try_from(&der).unwrap();
        for host in [
            "a.in.example.org",
            "in.example.org",
            "a.b.in.example.org",
            "exact.other.example.org",
            "x.other.example.org",
            "A.IN.EXAMPLE.ORG",
        ] {
            let name = rustls_pki_types::ServerName::try_from(host).unwrap();
            let webpki = cert.verify_is_valid_for_subject_name(&name).is_ok();
            let ours = sans.iter().any(|s| covers(s, host));
            assert_eq!(ours, webpki, "{host}");
        }
    }

    #[test]
    fn an_exact_name_beats_a_wildcard() {
        let both = vec!["*.example.org".to_owned(), "a.example.org".to_owned()];
        assert_eq!(match_of(&both, "a.example.org"), Some(Match::Exact));
        assert_eq!(match_of(&both, "b.example.org"), Some(Match::Wildcard));
        assert_eq!(match_of(&both, "example.org"), None);
    }
}
