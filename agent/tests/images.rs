//! The justfile's image recipes as an operator runs them, with `DRY_RUN=1`: `image` builds the
//! layout with `scripts/build-images`, and `push-images` copies what that layout holds to a
//! registry by digest and prints the workspace lines that pin both images, which a workspace
//! takes as they are. The images themselves run in the pod test of the integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

use crate::common::{bin, run};

/// The repository's root, as the justfile names it (without `..`).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the agent crate is in the repository")
        .to_owned()
}

/// Runs a justfile recipe with the image build and the pushes printed instead of run, the
/// images' layout being `layout`.
fn just(layout: &Path, args: &[&str]) -> (i32, String, String) {
    run(Command::new("just")
        .arg("--justfile")
        .arg(repo().join("deploy/justfile"))
        .args(args)
        .env("PRIVATE_INGRESS", env!("CARGO_BIN_EXE_private-ingress"))
        .env("IMAGES", layout)
        .env("DRY_RUN", "1")
        .env_remove("WORKSPACE"))
}

/// An image layout's index as `scripts/build-images` writes it, listing `images`
/// (`name:tag`, manifest digest); the recipes read nothing else of the layout.
fn write_index(layout: &Path, images: &[(&str, &str)]) {
    let manifests: Vec<Value> = images
        .iter()
        .map(|(name, digest)| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest,
                "size": 350,
                "annotations": { "org.opencontainers.image.ref.name": name },
            })
        })
        .collect();
    std::fs::create_dir_all(layout).unwrap();
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": manifests });
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
}

#[test]
fn image_builds_the_layout_with_the_build_script() {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("oci");
    let (code, stdout, err) = just(&layout, &["image"]);
    assert_eq!(code, 0, "{err}");
    let script = repo().join("scripts/build-images");
    assert_eq!(
        stdout.trim(),
        format!("{} --out {}", script.display(), layout.display()),
        "{stdout}"
    );
}

#[test]
fn push_images_copies_by_digest_and_prints_pins_the_workspace_takes() {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("oci");
    let registry = "registry.example:5000/ops";

    let (code, _, err) = just(&layout, &["push-images", registry]);
    assert_ne!(code, 0);
    assert!(err.contains("run 'just image' first"), "{err}");

    let agent_digest = format!("sha256:{}", "a".repeat(64));
    let sozu_digest = format!("sha256:{}", "b".repeat(64));
    // A layout missing one of the images pushes nothing.
    write_index(&layout, &[("private-ingress:0.1.0", &agent_digest)]);
    let (code, stdout, err) = just(&layout, &["push-images", registry]);
    assert_ne!(code, 0, "{stdout}");
    assert!(err.contains("no private-ingress or no sozu image"), "{err}");
    assert!(!stdout.contains("skopeo"), "{stdout}");

    write_index(
        &layout,
        &[
            ("private-ingress:0.1.0", &agent_digest),
            ("sozu:2.3.3", &sozu_digest),
        ],
    );
    // Without a registry host the images would go to Docker Hub: refused.
    let (code, stdout, err) = just(&layout, &["push-images", "ops"]);
    assert_ne!(code, 0, "{stdout}");
    assert!(err.contains("does not begin with a registry host"), "{err}");

    // A trailing slash is the same registry.
    let (code, stdout, err) = just(&layout, &["push-images", &format!("{registry}/")]);
    assert_eq!(code, 0, "{err}");
    for image in ["private-ingress:0.1.0", "sozu:2.3.3"] {
        let copy = format!(
            "skopeo copy --preserve-digests oci:{}:{image} docker://{registry}/{image}\n",
            layout.display()
        );
        assert!(stdout.contains(&copy), "{stdout}");
    }
    let agent_image = format!("{registry}/private-ingress:0.1.0@{agent_digest}");
    let sozu_image = format!("{registry}/sozu:2.3.3@{sozu_digest}");
    let pins: Vec<&str> = stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("deploy."))
        .collect();
    assert_eq!(
        pins,
        [
            format!("deploy.agent_image = \"{agent_image}\","),
            format!("deploy.sozu_image = \"{sozu_image}\","),
        ],
        "{stdout}"
    );

    // Pasted into a workspace that has deploy settings of its own, the pins name the images
    // the pod runs.
    let pins: String = pins.iter().map(|p| format!("  {p}\n")).collect();
    let workspace = dir.path().join("workspace.ncl");
    std::fs::write(
        &workspace,
        format!(
            "{{\n  zone = \"in.example.org\",\n  cluster_issuer = \"internal-ca\",\n  \
             routes = [{{ host = \"grafana.in.example.org\", upstream = \"10.0.0.12\", port = 3000 }}],\n  \
             deploy = {{ pre_stop_seconds = 3 }},\n{pins}}}\n"
        ),
    )
    .unwrap();
    let (code, yaml, err) = run(bin()
        .arg("render")
        .arg(&workspace)
        .args(["--format", "k8s"]));
    assert_eq!(code, 0, "render --format k8s: {err}");
    let images: Vec<(String, String)> = serde_norway::Deserializer::from_str(&yaml)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML parses"))
        .filter(|doc| doc["kind"] == "Deployment")
        .flat_map(|doc| {
            let spec = &doc["spec"]["template"]["spec"];
            ["initContainers", "containers"]
                .iter()
                .flat_map(|list| spec[list].as_array().cloned().unwrap_or_default())
                .collect::<Vec<_>>()
        })
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                c["image"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert!(
        images.contains(&("agent".to_owned(), agent_image.clone()))
            && images.contains(&("sozu".to_owned(), sozu_image.clone())),
        "{images:?}"
    );
}
