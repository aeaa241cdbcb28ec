//! `examples/kubernetes/` (docs/operations.md#kubernetes): every manifest
//! validates, strictly (unknown fields are errors), against the schemas of a
//! current Kubernetes release with `kubernetes-validate` (pip; `scripts/test`
//! installs it, and it carries its schemas, so no network is needed), and the
//! config in the ConfigMap passes `sidecache check` with the Secret's values.

use crate::support::sidecache::binary;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The newest release whose schemas kubernetes-validate 1.37 carries.
const KUBERNETES_VERSION: &str = "1.37.0";

fn manifests() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kubernetes");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    found.sort();
    assert!(found.len() >= 5, "manifests missing: {found:?}");
    found
}

#[test]
fn manifests_validate_against_current_kubernetes_schemas() {
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .args(manifests())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run kubernetes-validate ({e}): install it with \
                 `pip install kubernetes-validate` (scripts/test does)"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "manifests do not validate:\n{text}");
    for kind in [
        "configmap",
        "deployment",
        "poddisruptionbudget",
        "secret",
        "service",
    ] {
        assert!(
            text.contains(&format!("resource {kind}/")),
            "{kind} not validated:\n{text}"
        );
    }
}

#[derive(serde::Deserialize)]
struct Manifest {
    #[serde(default)]
    data: BTreeMap<String, String>,
    #[serde(default, rename = "stringData")]
    string_data: BTreeMap<String, String>,
}

fn manifest(name: &str) -> Manifest {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/kubernetes")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("read manifest");
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn configmap_config_passes_check_with_the_secrets_values() {
    let config = manifest("configmap.yaml")
        .data
        .remove("sidecache.yaml")
        .expect("sidecache.yaml");
    let secret = manifest("secret.yaml").string_data;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sidecache.yaml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(binary())
        .arg("check")
        .arg("--config")
        .arg(&path)
        .env_remove("SIDECACHE_CONFIG")
        .envs(&secret)
        .output()
        .expect("run sidecache check");
    assert!(
        out.status.success(),
        "check failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
