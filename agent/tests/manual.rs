//! What a user installs beside the binary: the shells' completion scripts and the manual page,
//! and the exit codes the README promises.

use crate::common::{bin, run};
use std::path::Path;

const SUBCOMMANDS: [&str; 9] = [
    "check",
    "render",
    "import",
    "run",
    "status",
    "top",
    "schema",
    "completions",
    "man",
];

#[test]
fn every_shell_completes_the_subcommands_and_not_the_hidden_one() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, script, err) = run(bin().args(["completions", shell]));
        assert_eq!(code, 0, "{shell}: {err}");
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell}: no `{sub}` in\n{script}");
        }
        // fish writes `-l admin-address`, the others `--admin-address`.
        for flag in [
            "admin-address",
            "timeout",
            "format",
            "eval-timeout",
            "refresh",
            "once",
        ] {
            assert!(script.contains(flag), "{shell}: no `{flag}` in\n{script}");
        }
        assert!(!script.contains("__evaluate-workspace"), "{shell}");
    }
    // The formats `render` takes are completed too.
    let (_, bash, _) = run(bin().args(["completions", "bash"]));
    assert!(
        bash.contains("sozu-toml") && bash.contains("prometheus-rules"),
        "{bash}"
    );

    let (code, _, err) = run(bin().args(["completions", "tcsh"]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("possible values: bash, elvish, fish, powershell, zsh"),
        "{err}"
    );
}

/// The manual page, in roff (where `-` is written `\-`): every subcommand and every flag, the
/// exit status and NO_COLOR.
#[test]
fn the_manual_names_every_subcommand_and_flag() {
    let (code, page, err) = run(bin().arg("man"));
    assert_eq!(code, 0, "{err}");
    assert!(page.contains("\n.TH PRIVATE-INGRESS 1"), "{page}");
    for sub in SUBCOMMANDS {
        let heading = format!(".SH \"PRIVATE-INGRESS {}\"", sub.to_uppercase());
        assert!(page.contains(&heading), "no {heading} in\n{page}");
    }
    let (_, help, _) = run(bin().args(["run", "--help"]));
    let flags: Vec<&str> = help
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| w.trim_end_matches([',', '.', ')']))
        .collect();
    assert!(flags.len() > 10, "{help}");
    for flag in flags.into_iter().chain([
        "--timeout",
        "--output",
        "--json",
        "--alert-for-scale",
        "--refresh",
        "--once",
        "--pane",
        "--ascii",
        "--size",
    ]) {
        let roff = flag.replace('-', "\\-");
        assert!(page.contains(&roff), "no {flag} in the manual");
    }
    for section in [".SH \"EXIT STATUS\"", ".SH ENVIRONMENT", "NO_COLOR"] {
        assert!(page.contains(section), "no {section} in\n{page}");
    }
    assert!(!page.contains("evaluate\\-workspace"), "{page}");
}

/// The README's table of exit codes is the one the manual prints, which `main` exits with.
#[test]
fn the_readme_lists_the_exit_codes_the_manual_does() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let table = readme
        .split("### Exit codes")
        .nth(1)
        .expect("an `Exit codes` section in the README");
    let from_readme: Vec<String> = table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .filter_map(|l| l.split('|').nth(1).map(|c| c.trim().to_owned()))
        .collect();
    let (_, page, _) = run(bin().arg("man"));
    let exit_status = page
        .split(".SH \"EXIT STATUS\"")
        .nth(1)
        .and_then(|rest| rest.split("\n.SH ").next())
        .unwrap();
    let from_manual: Vec<String> = exit_status
        .lines()
        .filter_map(|l| l.strip_prefix("\\fB").and_then(|l| l.strip_suffix("\\fR")))
        .map(str::to_owned)
        .collect();
    assert_eq!(from_readme, from_manual, "README vs\n{exit_status}");
    assert_eq!(from_manual, ["0", "1", "2", "3"]);
}
