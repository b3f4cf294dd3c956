//! Container images as a node gets them: from an OCI image layout (`scripts/build-images` writes
//! one), each reference resolved as a registry resolves it, then unpacked with umoci.
//!
//! - **Resolution:** a reference with a digest (`registry/name[:tag]@sha256:<hex>`) names the
//!   manifest of that digest and nothing else, its tag ignored, as a registry does; a reference
//!   without one names the image tagged `name:tag` in the layout (`latest` when it has no tag),
//!   whatever its registry and path. A reference the layout cannot satisfy is an error that
//!   says what the layout holds: the pod never runs something else than what it names.
//! - **Integrity:** the manifest and the configuration are read by digest and checked against
//!   it here; umoci checks the layers it unpacks, and the bundle it leaves says which manifest
//!   it unpacked, which must be the one resolved.
//! - **Configuration:** the entrypoint, default arguments, environment, working directory and
//!   user of the image's configuration, for the sandbox to apply with Kubernetes' rules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// What may go wrong between a reference and an unpacked image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an OCI {what}: {source}")]
    Parse {
        path: PathBuf,
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("{reference}: the image layout {layout} holds no manifest {digest}; it holds {held}")]
    NoSuchDigest {
        reference: String,
        digest: String,
        layout: PathBuf,
        held: String,
    },
    #[error(
        "{reference}: the image layout {layout} holds no image tagged {name}; it holds {held}"
    )]
    NoSuchTag {
        reference: String,
        name: String,
        layout: PathBuf,
        held: String,
    },
    #[error("{digest}: not a sha256 digest")]
    BadDigest { digest: String },
    #[error("{path} does not hash to its name: sha256:{actual}")]
    Corrupt { path: PathBuf, actual: String },
    #[error("umoci unpack {reference} into {bundle}: {why}")]
    Unpack {
        reference: String,
        bundle: PathBuf,
        why: String,
    },
    #[error("{reference}: umoci unpacked {unpacked}, not the manifest {digest} it resolves to")]
    Unpacked {
        reference: String,
        digest: String,
        unpacked: String,
    },
}

/// The images of an OCI image layout, by tag (the layout's `org.opencontainers.image.ref.name`,
/// e.g. `sozu:2.3.3`) and manifest digest.
#[derive(Debug, Clone)]
pub struct Images {
    dir: PathBuf,
    manifests: Vec<Listed>,
}

/// One manifest of the layout's index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its tag in the layout, `name:tag`.
    pub name: String,
    /// `sha256:<hex>`.
    pub digest: String,
}

/// The parts of an image configuration a runtime applies (the OCI image spec's `config`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Config {
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

/// An image unpacked for a pod.
#[derive(Debug, Clone)]
pub struct Image {
    /// The reference the pod names.
    pub reference: String,
    /// The manifest it resolved to.
    pub digest: String,
    /// The image's root filesystem, as umoci unpacked it: each container gets its own copy
    /// (see the sandbox), this one is never run.
    pub rootfs: PathBuf,
    pub config: Config,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    config: Config,
}

/// What umoci leaves in a bundle about the image it unpacked (`umoci.json`).
#[derive(Deserialize)]
struct BundleMeta {
    from_descriptor_path: DescriptorPath,
}

#[derive(Deserialize)]
struct DescriptorPath {
    descriptor_walk: Vec<Descriptor>,
}

const REF_NAME: &str = "org.opencontainers.image.ref.name";

impl Images {
    /// The images of the layout at `dir`, as its `index.json` lists them.
    pub fn open(dir: &Path) -> Result<Images, ImageError> {
        let path = dir.join("index.json");
        let index: Index = parse(&read(&path)?, &path, "image index")?;
        let manifests = index
            .manifests
            .into_iter()
            .map(|m| Listed {
                name: m.annotations.get(REF_NAME).cloned().unwrap_or_default(),
                digest: m.digest,
            })
            .collect();
        Ok(Images {
            dir: dir.to_owned(),
            manifests,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifests(&self) -> &[Listed] {
        &self.manifests
    }

    /// The image tagged `name` (`sozu:2.3.3`) pinned by its digest under `registry`, as a
    /// workspace names it: `registry/sozu:2.3.3@sha256:…`. Panics if the layout has no such tag.
    pub fn pinned(&self, registry: &str, name: &str) -> String {
        let listed = self
            .manifests
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{}: no image tagged {name}", self.dir.display()));
        format!("{registry}/{name}@{}", listed.digest)
    }

    /// The manifest `reference` names: by digest when it has one, else by tag.
    pub fn resolve(&self, reference: &str) -> Result<&Listed, ImageError> {
        let (name, digest) = match reference.split_once('@') {
            Some((name, digest)) => (name, Some(digest)),
            None => (reference, None),
        };
        if let Some(digest) = digest {
            return self
                .manifests
                .iter()
                .find(|m| m.digest == digest)
                .ok_or_else(|| ImageError::NoSuchDigest {
                    reference: reference.to_owned(),
                    digest: digest.to_owned(),
                    layout: self.dir.clone(),
                    held: self.held(),
                });
        }
        // `registry:5000/path/name:tag`: the tag follows the last `:` after the last `/`.
        let last = name.rsplit('/').next().unwrap_or(name);
        let tagged = if last.contains(':') {
            last.to_owned()
        } else {
            format!("{last}:latest")
        };
        self.manifests
            .iter()
            .find(|m| m.name == tagged)
            .ok_or_else(|| ImageError::NoSuchTag {
                reference: reference.to_owned(),
                name: tagged,
                layout: self.dir.clone(),
                held: self.held(),
            })
    }

    /// Unpacks the image `reference` names into `bundle` (which must not exist) with umoci,
    /// and reads its configuration.
    pub fn unpack(&self, reference: &str, bundle: &Path) -> Result<Image, ImageError> {
        let listed = self.resolve(reference)?.clone();
        let manifest: Manifest = self.blob(&listed.digest, "image manifest")?;
        let config: ConfigFile = self.blob(&manifest.config.digest, "image configuration")?;
        let unpack_error = |why: String| ImageError::Unpack {
            reference: reference.to_owned(),
            bundle: bundle.to_owned(),
            why,
        };
        let mut umoci = Command::new("umoci");
        umoci.arg("unpack");
        if !nix::unistd::geteuid().is_root() {
            umoci.arg("--rootless");
        }
        let output = umoci
            .arg("--image")
            .arg(format!("{}:{}", self.dir.display(), listed.name))
            .arg(bundle)
            .output()
            .map_err(|e| {
                unpack_error(format!(
                    "cannot run umoci ({e}): install it (Debian: umoci)"
                ))
            })?;
        if !output.status.success() {
            return Err(unpack_error(
                String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            ));
        }
        let meta_path = bundle.join("umoci.json");
        let meta: BundleMeta = parse(&read(&meta_path)?, &meta_path, "umoci bundle")?;
        let unpacked = meta
            .from_descriptor_path
            .descriptor_walk
            .first()
            .map(|d| d.digest.clone())
            .unwrap_or_default();
        if unpacked != listed.digest {
            return Err(ImageError::Unpacked {
                reference: reference.to_owned(),
                digest: listed.digest,
                unpacked,
            });
        }
        Ok(Image {
            reference: reference.to_owned(),
            digest: listed.digest,
            rootfs: bundle.join("rootfs"),
            config: config.config,
        })
    }

    /// The blob of `digest`, checked against it, parsed.
    fn blob<T: serde::de::DeserializeOwned>(
        &self,
        digest: &str,
        what: &'static str,
    ) -> Result<T, ImageError> {
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| ImageError::BadDigest {
                digest: digest.to_owned(),
            })?;
        let path = self.dir.join("blobs/sha256").join(hex);
        let bytes = read(&path)?;
        let actual: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if actual != hex {
            return Err(ImageError::Corrupt { path, actual });
        }
        parse(&bytes, &path, what)
    }

    fn held(&self) -> String {
        let held: Vec<String> = self
            .manifests
            .iter()
            .map(|m| format!("{}@{}", m.name, m.digest))
            .collect();
        if held.is_empty() {
            "nothing".to_owned()
        } else {
            held.join(", ")
        }
    }
}

/// The images a pod's containers name, each unpacked once into the pod's directory.
pub struct PodImages<'a> {
    images: &'a Images,
    dir: PathBuf,
    unpacked: BTreeMap<String, Image>,
}

impl<'a> PodImages<'a> {
    pub fn new(images: &'a Images, dir: &Path) -> PodImages<'a> {
        PodImages {
            images,
            dir: dir.to_owned(),
            unpacked: BTreeMap::new(),
        }
    }

    /// The image `reference` names, unpacked on first use.
    pub fn get(&mut self, reference: &str) -> Result<Image, ImageError> {
        let digest = self.images.resolve(reference)?.digest.clone();
        if let Some(image) = self.unpacked.get(&digest) {
            return Ok(Image {
                reference: reference.to_owned(),
                ..image.clone()
            });
        }
        let name = digest.trim_start_matches("sha256:");
        let bundle = self.dir.join(&name[..name.len().min(12)]);
        let image = self.images.unpack(reference, &bundle)?;
        self.unpacked.insert(digest, image.clone());
        Ok(image)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, ImageError> {
    std::fs::read(path).map_err(|source| ImageError::Read {
        path: path.to_owned(),
        source,
    })
}

fn parse<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    path: &Path,
    what: &'static str,
) -> Result<T, ImageError> {
    serde_json::from_slice(bytes).map_err(|source| ImageError::Parse {
        path: path.to_owned(),
        what,
        source,
    })
}
