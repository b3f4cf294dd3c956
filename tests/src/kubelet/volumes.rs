//! The pod's volumes on the host, made as the kubelet and cert-manager's CSI driver make them.
//!
//! - `emptyDir`: a directory every container of the pod that mounts it shares, world-writable,
//!   group-owned by `fsGroup` with the set-group-id bit (the kubelet's volume ownership). With
//!   `medium: Memory` it lives in `/dev/shm` (tmpfs); `sizeLimit` is not enforced.
//! - `configMap`: the items of the named ConfigMap, written by [`atomic_write`] with mode 0644
//!   and group `fsGroup`, always mounted read-only.
//! - `secret`: the same, from a Secret the test gives ([`Placement::secrets`]: the operator
//!   creates it, the render does not), with its `defaultMode`; a Secret that is missing keeps
//!   the pod from starting unless the volume is optional.
//! - a StatefulSet's claim: a directory per claim under [`Placement::claims`], named as
//!   Kubernetes names the claim (`<template>-<set>-<ordinal>`), made on first use and kept: the
//!   next pod of the same ordinal mounts the same one. The kubelet gives it to `fsGroup` (group
//!   owner, set-group-id, group-writable), as it does a new filesystem. A new filesystem's root
//!   is root's, which a container of this kubelet cannot see (its user namespace maps its own
//!   user only: root shows as the overflow uid), so the directory is the pod's `runAsUser`'s
//!   here; the agent takes either owner (`check_private` in the agent's `acme::store`).
//! - `csi` (`csi.cert-manager.io`): what the driver writes for its `volumeAttributes`: a new
//!   RSA key (PKCS#1, the driver's default key algorithm) and its CSR, signed by the test's
//!   ClusterIssuer for `dns-names`; `tls.crt` (leaf, then the CA), `tls.key` and `ca.crt`, 0440,
//!   group `fs-group`, swapped in by [`atomic_write`]. [`Volumes::renew`] is a renewal.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::Volume;
use rcgen::{CertificateParams, CertificateSigningRequestParams, CertifiedIssuer, KeyPair};

use super::manifest::Manifest;
use super::Placement;

/// One volume, where it is on the host, and whether a container may write to it at all.
pub struct HostVolume {
    pub path: PathBuf,
    pub writable: bool,
}

pub struct Volumes {
    pub by_name: BTreeMap<String, HostVolume>,
    csi: BTreeMap<String, CsiVolume>,
    /// Each Secret volume: its Secret's name, its items (key, path, mode; `None`: every key,
    /// with the default mode), its group, and how many payloads it has had.
    secrets: BTreeMap<String, SecretVolume>,
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Memory-backed emptyDirs live here, removed with the pod.
    memory: tempfile::TempDir,
}

struct SecretVolume {
    secret: String,
    items: Option<Vec<(String, String, u32)>>,
    mode: u32,
    group: Option<u32>,
    generation: AtomicU32,
}

struct CsiVolume {
    dir: PathBuf,
    dns_names: Vec<String>,
    fs_group: Option<u32>,
    generation: AtomicU32,
}

impl Volumes {
    /// Makes every volume of the pod under `dir`, as the kubelet does before starting any
    /// container (a pod with a CSI volume waits in ContainerCreating until the driver has
    /// written it).
    pub fn create(dir: &Path, manifest: &Manifest, placement: &Placement) -> Volumes {
        let spec = &manifest.spec;
        let fs_group = spec
            .security_context
            .as_ref()
            .and_then(|s| s.fs_group)
            .map(|g| u32::try_from(g).expect("fsGroup is a group id"));
        let memory = tempfile::Builder::new()
            .prefix("pi-pod-")
            .tempdir_in("/dev/shm")
            .expect("a directory in /dev/shm for memory-backed emptyDirs");
        std::fs::set_permissions(memory.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod the memory-backed volumes' directory");
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name.push(
            rcgen::DnType::CommonName,
            "private-ingress test ClusterIssuer",
        );
        let issuer = CertifiedIssuer::self_signed(ca, ca_key).expect("a self-signed CA");
        let mut volumes = Volumes {
            by_name: BTreeMap::new(),
            csi: BTreeMap::new(),
            secrets: BTreeMap::new(),
            issuer,
            memory,
        };
        for volume in spec.volumes.as_deref().unwrap_or_default() {
            volumes.add(dir, volume, manifest, placement, fs_group);
        }
        for template in &manifest.claim_templates {
            let name = template
                .metadata
                .name
                .clone()
                .expect("a named claim template");
            let root = placement.claims.as_deref().unwrap_or_else(|| {
                panic!("the pod mounts the claim {name}: give it a place for claims")
            });
            let path = root.join(format!("{name}-{}-{}", manifest.name, placement.ordinal));
            if !path.exists() {
                std::fs::create_dir_all(&path).expect("create a claim's volume");
                let user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
                let user = user.map(|u| u32::try_from(u).expect("runAsUser is a user id"));
                std::os::unix::fs::lchown(&path, user, fs_group).expect("chown a claim's volume");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o2775))
                    .expect("chmod a claim's volume");
            }
            volumes.by_name.insert(
                name,
                HostVolume {
                    path,
                    writable: true,
                },
            );
        }
        volumes
    }

    fn add(
        &mut self,
        dir: &Path,
        volume: &Volume,
        manifest: &Manifest,
        placement: &Placement,
        fs_group: Option<u32>,
    ) {
        let name = volume.name.clone();
        let host = if let Some(empty) = &volume.empty_dir {
            let base = if empty.medium.as_deref() == Some("Memory") {
                self.memory.path()
            } else {
                dir
            };
            let path = base.join(&name);
            std::fs::create_dir(&path).expect("create an emptyDir");
            // 0777 plus the kubelet's ownership for fsGroup: group set, set-group-id bit.
            let mode = if fs_group.is_some() { 0o2777 } else { 0o777 };
            chown_group(&path, fs_group);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .expect("chmod an emptyDir");
            HostVolume {
                path,
                writable: true,
            }
        } else if let Some(source) = &volume.config_map {
            let map_name = &source.name;
            let data = manifest.config_maps.get(map_name).unwrap_or_else(|| {
                panic!("volume {name} names the ConfigMap {map_name}, which the stream lacks")
            });
            let mode = source.default_mode.unwrap_or(0o644) as u32;
            let files: Vec<(String, Vec<u8>, u32)> = match &source.items {
                Some(items) => items
                    .iter()
                    .map(|item| {
                        let text = data.get(&item.key).unwrap_or_else(|| {
                            panic!("ConfigMap {map_name} has no key {}", item.key)
                        });
                        let mode = item.mode.map_or(mode, |m| m as u32);
                        (item.path.clone(), text.clone().into_bytes(), mode)
                    })
                    .collect(),
                None => data
                    .iter()
                    .map(|(key, text)| (key.clone(), text.clone().into_bytes(), mode))
                    .collect(),
            };
            let path = dir.join(&name);
            atomic_write(&path, &files, fs_group, 0);
            HostVolume {
                path,
                writable: false,
            }
        } else if let Some(source) = &volume.secret {
            let secret_name = source.secret_name.as_deref().expect("a named Secret");
            let optional = source.optional == Some(true);
            let empty = BTreeMap::new();
            let data = match placement.secrets.get(secret_name) {
                Some(data) => data,
                None if optional => &empty,
                None => panic!(
                    "volume {name} names the Secret {secret_name}, which the cluster lacks: the \
                     pod would wait in ContainerCreating"
                ),
            };
            let mode = source.default_mode.unwrap_or(0o644) as u32;
            let files: Vec<(String, Vec<u8>, u32)> = match &source.items {
                Some(items) => items
                    .iter()
                    .filter_map(|item| {
                        let contents = data.get(&item.key);
                        assert!(
                            contents.is_some() || optional,
                            "Secret {secret_name} has no key {}",
                            item.key
                        );
                        let mode = item.mode.map_or(mode, |m| m as u32);
                        contents.map(|c| (item.path.clone(), c.clone(), mode))
                    })
                    .collect(),
                None => data
                    .iter()
                    .map(|(key, contents)| (key.clone(), contents.clone(), mode))
                    .collect(),
            };
            let path = dir.join(&name);
            atomic_write(&path, &files, fs_group, 0);
            self.secrets.insert(
                name.clone(),
                SecretVolume {
                    secret: secret_name.to_owned(),
                    items: source.items.as_ref().map(|items| {
                        items
                            .iter()
                            .map(|i| {
                                let mode = i.mode.map_or(mode, |m| m as u32);
                                (i.key.clone(), i.path.clone(), mode)
                            })
                            .collect()
                    }),
                    mode,
                    group: fs_group,
                    generation: AtomicU32::new(1),
                },
            );
            HostVolume {
                path,
                writable: false,
            }
        } else if let Some(csi) = &volume.csi {
            let attributes = csi.volume_attributes.clone().unwrap_or_default();
            let attribute = |key: &str| attributes.get(&format!("csi.cert-manager.io/{key}"));
            for key in attributes.keys() {
                let known = ["issuer-name", "issuer-kind", "dns-names", "fs-group"];
                assert!(
                    known
                        .iter()
                        .any(|k| key == &format!("csi.cert-manager.io/{k}")),
                    "the pod harness does not emulate the CSI attribute {key}"
                );
            }
            assert!(
                attribute("issuer-name").is_some(),
                "{name}: issuer-name is required"
            );
            assert_eq!(
                csi.read_only,
                Some(true),
                "{name}: cert-manager's CSI driver only mounts read-only volumes"
            );
            let dns_names = attribute("dns-names")
                .map(|names| names.split(',').map(str::to_owned).collect())
                .unwrap_or_default();
            let fs_group = attribute("fs-group").map(|g| g.parse().expect("fs-group is a number"));
            let path = dir.join(&name);
            let volume = CsiVolume {
                dir: path.clone(),
                dns_names,
                fs_group,
                generation: AtomicU32::new(0),
            };
            self.issue(&volume);
            self.csi.insert(name.clone(), volume);
            HostVolume {
                path,
                writable: false,
            }
        } else {
            unreachable!("refused by Manifest::parse");
        };
        self.by_name.insert(name, host);
    }

    /// The Secret `secret` changed to `data`: each volume of it gets the new payload, swapped in
    /// the way the kubelet swaps it (AtomicWriter), as it does within a minute or so of the
    /// change in a cluster.
    pub fn update_secret(&self, secret: &str, data: &BTreeMap<String, Vec<u8>>) {
        for (name, volume) in self.secrets.iter().filter(|(_, v)| v.secret == secret) {
            let files: Vec<(String, Vec<u8>, u32)> = match &volume.items {
                Some(items) => items
                    .iter()
                    .filter_map(|(key, path, mode)| {
                        data.get(key).map(|c| (path.clone(), c.clone(), *mode))
                    })
                    .collect(),
                None => data
                    .iter()
                    .map(|(key, c)| (key.clone(), c.clone(), volume.mode))
                    .collect(),
            };
            let generation = volume.generation.fetch_add(1, Ordering::SeqCst);
            atomic_write(&self.by_name[name].path, &files, volume.group, generation);
        }
    }

    /// A renewal of the CSI volume whose `dns-names` hold `host`: a new key and certificate,
    /// swapped in. Returns the new leaf's SHA-256 fingerprint.
    pub fn renew(&self, host: &str) -> String {
        self.issue(self.csi_volume(host))
    }

    /// The SHA-256 fingerprint of the leaf the CSI volume of `host` holds now.
    pub fn fingerprint(&self, host: &str) -> String {
        let chain = std::fs::read_to_string(self.csi_volume(host).dir.join("tls.crt"))
            .expect("read tls.crt");
        crate::live::fingerprint_of_pem(&chain)
    }

    fn csi_volume(&self, host: &str) -> &CsiVolume {
        self.csi
            .values()
            .find(|v| v.dns_names.iter().any(|n| n == host))
            .unwrap_or_else(|| panic!("no CSI volume for {host}"))
    }

    fn issue(&self, volume: &CsiVolume) -> String {
        let key = openssl(&["genrsa", "-traditional", "2048"], None);
        let subject = format!(
            "/CN={}",
            volume.dns_names.first().map_or("", String::as_str)
        );
        let csr = openssl(
            &["req", "-new", "-key", "/dev/stdin", "-subj", &subject],
            Some(&key),
        );
        let mut request =
            CertificateSigningRequestParams::from_pem(&csr).expect("openssl wrote a CSR");
        request.params = CertificateParams::new(volume.dns_names.clone()).expect("leaf parameters");
        let leaf = request.signed_by(&self.issuer).expect("sign the CSR");
        let chain = format!("{}{}", leaf.pem(), self.issuer.pem());
        let generation = volume.generation.fetch_add(1, Ordering::SeqCst);
        atomic_write(
            &volume.dir,
            &[
                ("tls.crt".into(), chain.into_bytes(), 0o440),
                ("ca.crt".into(), self.issuer.pem().into_bytes(), 0o440),
                ("tls.key".into(), key.into_bytes(), 0o440),
            ],
            volume.fs_group,
            generation,
        );
        crate::live::fingerprint_of_der(leaf.der())
    }
}

impl Drop for Volumes {
    fn drop(&mut self) {
        // Files the containers wrote belong to their user; root removes them all the same.
        let _ = std::fs::remove_dir_all(self.memory.path());
    }
}

/// Runs openssl with `input` on stdin; returns its stdout.
fn openssl(args: &[&str], input: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run openssl (Debian's openssl; scripts/test installs it)");
    let mut stdin = child.stdin.take().expect("openssl's stdin");
    if let Some(input) = input {
        stdin.write_all(input.as_bytes()).expect("write to openssl");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("wait for openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("openssl writes PEM")
}

fn chown_group(path: &Path, group: Option<u32>) {
    if let Some(group) = group {
        std::os::unix::fs::lchown(path, None, Some(group)).expect("chown to fsGroup");
    }
}

/// Kubernetes' AtomicWriter, which both the kubelet (ConfigMap and Secret volumes) and
/// cert-manager's CSI driver use: `files` (path, contents, mode) go into a new timestamped
/// directory, a `..data_tmp` link to it is renamed over `..data` (the one atomic step), each top
/// entry gets a visible link through `..data`, and the previous directory is removed at once.
/// With `group`, every file and directory is given that group (fsGroup).
pub fn atomic_write(
    dir: &Path,
    files: &[(String, Vec<u8>, u32)],
    group: Option<u32>,
    generation: u32,
) -> std::time::SystemTime {
    std::fs::create_dir_all(dir).expect("create the volume directory");
    chown_group(dir, group);
    let stamp = format!("..2026_11_30_00_00_{:02}.{generation}", generation % 60);
    let new = dir.join(&stamp);
    std::fs::create_dir(&new).expect("create the timestamped directory");
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    chown_group(&new, group);
    for (path, contents, mode) in files {
        let file = new.join(path);
        if let Some(parent) = file.parent() {
            if parent != new {
                std::fs::create_dir_all(parent).expect("create a directory of the payload");
                chown_group(parent, group);
            }
        }
        std::fs::write(&file, contents).expect("write a file of the payload");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(*mode)).expect("chmod");
        chown_group(&file, group);
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::os::unix::fs::symlink(&stamp, dir.join("..data_tmp")).expect("link ..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    let renamed = std::time::SystemTime::now();
    let top: std::collections::BTreeSet<&str> = files
        .iter()
        .map(|(path, _, _)| path.split('/').next().unwrap_or(path))
        .collect();
    for name in top {
        if std::fs::symlink_metadata(dir.join(name)).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name))
                .expect("link a visible name");
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).expect("remove the previous payload");
    }
    renamed
}
