//! Every file of schema/examples/bad/ is refused with the message and at the position it names.

use super::*;

/// Each file in schema/examples/bad/ names the message `check` must print (`# expect:`) and
/// the line and column the diagnostic must point at in that file (`# at:`); no report
/// suggests `, ..` or shows the plumbing that applies the contract.
///
/// Each is checked on both tiers of `Routes`: as written, and among valid routes that use the
/// newer fields (before and after its own routes), which the fast tier checks. The report must
/// say the same words at the same place, the copy's routes must take no more of the slow tier
/// than the example's own (a mistake's route, or a valid route the fast tier leaves out), and
/// the added routes must take the fast tier wherever routes are checked at all.
#[test]
fn every_bad_example_is_refused_with_its_message_at_its_line() {
    const ADDED: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    // What the examples name (a users file) is read from beside them.
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    for entry in std::fs::read_dir(examples().join("bad/files")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, files.join(path.file_name().unwrap())).unwrap();
    }
    let (mut checked, mut on_both_tiers) = (0, 0);
    for entry in std::fs::read_dir(examples().join("bad")).unwrap() {
        let path = entry.unwrap().path();
        // `files/` holds what examples name (a users file), not examples.
        if path.extension().is_none_or(|e| e != "ncl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let example = BadExample::read(&path, &text);
        let (report, tiers) = example.report(&path);
        example.assert_refused(&path, &report);
        checked += 1;

        let Some((copy_text, moved)) = among_fast_routes(&text, &example, ADDED) else {
            continue;
        };
        let copy = dir.path().join(path.file_name().unwrap());
        std::fs::write(&copy, &copy_text).unwrap();
        let moved = BadExample {
            named: moved.named.map(|named| {
                dir.path()
                    .join(named.strip_prefix(path.parent().unwrap()).unwrap())
            }),
            ..moved
        };
        let (copy_report, copy_tiers) = moved.report(&copy);
        moved.assert_refused(&copy, &copy_report);
        // Reports may name the workspace's directory, as given or as resolved.
        let dirs: Vec<String> = [dir.path(), path.parent().unwrap()]
            .into_iter()
            .flat_map(|d| [d.to_owned(), d.canonicalize().unwrap()])
            .map(|d| d.display().to_string())
            .collect();
        let anywhere = |l: &String| {
            dirs.iter()
                .fold(l.clone(), |l, d| l.replace(d.as_str(), "<workspace>"))
        };
        let copy_words: Vec<_> = words(&copy_report).iter().map(anywhere).collect();
        let shifted: Vec<_> = words(&report)
            .iter()
            .map(|l| shift_indexes(&anywhere(l), ADDED))
            .collect();
        assert_eq!(
            copy_words,
            shifted,
            "{} among fast routes:\n{copy_text}",
            path.display()
        );
        assert_eq!(
            copy_tiers.slow,
            tiers.slow,
            "{}: the added routes took the slow tier ({copy_tiers:?}, as written {tiers:?})",
            path.display()
        );
        if copy_tiers.ran() {
            assert!(
                copy_tiers.fast >= ADDED,
                "{}: the added routes did not take the fast tier ({copy_tiers:?})",
                path.display()
            );
            on_both_tiers += 1;
        }
    }
    assert!(checked >= 20, "only {checked} bad examples found");
    // Most examples reach `routes`; one refused before they are checked says nothing of them.
    assert!(
        on_both_tiers >= checked / 2,
        "only {on_both_tiers} of {checked} bad examples had their routes checked among fast ones"
    );
}

#[test]
fn many_duplicates_are_capped_in_one_report() {
    let dir = tempfile::tempdir().unwrap();
    let routes: String = (0..15)
        .map(|_| "{ host = \"a.in.example.org\", upstream = \"a\", port = 1 },\n")
        .collect();
    let path = write(
        &dir,
        "dups.ncl",
        &format!("{{ zone = \"in.example.org\", cluster_issuer = \"ca\", routes = [\n{routes}] }}"),
    );
    let report = diagnostic(&path);
    assert_eq!(report.matches("error: duplicate route").count(), 10);
    assert!(
        report.contains("... and 4 more duplicate routes"),
        "{report}"
    );
}
