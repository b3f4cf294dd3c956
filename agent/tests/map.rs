//! The maps of the crate cannot drift from its modules: `lib.rs`'s table names every top-level
//! module, and docs/agent.md's module map every module file (an entry `folder/*` covering a
//! folder). A module added without its line on the map fails here, naming it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn agent() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every module of `src`, as a path without `.rs` (`reconcile/driver`; a folder's `mod.rs` is
/// the folder), tests left out.
fn modules(src: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![src.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "tests" {
                    dirs.push(path);
                }
                continue;
            }
            let Some(stem) = name.strip_suffix(".rs") else {
                continue;
            };
            if stem == "tests" {
                continue;
            }
            let rel = path.parent().unwrap().strip_prefix(src).unwrap().to_owned();
            let module = match stem {
                "mod" => rel,
                _ => rel.join(stem),
            };
            let module = module.to_string_lossy().into_owned();
            if !matches!(module.as_str(), "lib" | "main") {
                found.insert(module);
            }
        }
    }
    found
}

/// The first column of docs/agent.md's "Module map" table: each module named in backquotes.
fn agent_md_entries() -> BTreeSet<String> {
    let text = std::fs::read_to_string(agent().join("../docs/agent.md")).unwrap();
    let table = text
        .split("## Module map")
        .nth(1)
        .expect("docs/agent.md has a module map")
        .split("\n## ")
        .next()
        .unwrap();
    table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            let first = l.split('|').nth(1).unwrap_or_default();
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn every_module_is_on_the_map() {
    let src = agent().join("src");
    let all = modules(&src);
    assert!(all.len() > 50, "too few modules found: {all:?}");

    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let map: String = lib
        .lines()
        .filter(|l| l.starts_with("//! |"))
        .collect::<Vec<_>>()
        .join("\n");
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .collect();
    let off_lib: Vec<_> = declared
        .iter()
        .filter(|m| !map.contains(&format!("[`{m}`]")))
        .collect();
    assert!(
        off_lib.is_empty(),
        "lib.rs declares modules its map (the //! table) does not name: {off_lib:?}"
    );
    let top: BTreeSet<&str> = all.iter().map(|m| m.split('/').next().unwrap()).collect();
    let undeclared: Vec<_> = top.iter().filter(|m| !declared.contains(m)).collect();
    assert!(
        undeclared.is_empty(),
        "not declared in lib.rs: {undeclared:?}"
    );

    let entries = agent_md_entries();
    let covered = |module: &str| {
        entries.contains(module)
            || module
                .match_indices('/')
                .any(|(i, _)| entries.contains(&format!("{}/*", &module[..i])))
            || entries.contains(&format!("{module}/*"))
    };
    let off_doc: Vec<_> = all.iter().filter(|m| !covered(m)).collect();
    assert!(
        off_doc.is_empty(),
        "docs/agent.md's module map does not name: {off_doc:?}"
    );
    let stale: Vec<_> = entries
        .iter()
        .filter(|e| !all.contains(e.trim_end_matches("/*")))
        .collect();
    assert!(
        stale.is_empty(),
        "docs/agent.md's module map names modules that do not exist: {stale:?}"
    );
}
