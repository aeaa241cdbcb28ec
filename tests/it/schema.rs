//! The config's JSON Schema (`sidecache schema`), generated from the file
//! model: the committed copy is current, every config in the repository
//! validates against it, and it is not vacuous (unknown keys and wrong
//! shapes are refused, as the loader refuses them).

use crate::support::sidecache::binary;
use std::path::Path;
use std::process::Command;

fn printed_schema() -> serde_json::Value {
    let out = Command::new(binary())
        .arg("schema")
        .output()
        .expect("run sidecache schema");
    assert!(out.status.success(), "sidecache schema failed");
    serde_json::from_slice(&out.stdout).expect("the schema is JSON")
}

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A config file as the loader sees it after `${VAR:-default}`
/// interpolation (each variable at its default, else a plain word), as
/// JSON.
fn config_json(text: &str) -> serde_json::Value {
    let re = regex::Regex::new(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::-([^}]*))?\}").expect("regex");
    let text = re.replace_all(text, |c: &regex::Captures| {
        c.get(1).map_or("x".to_owned(), |d| d.as_str().to_owned())
    });
    // The conformance configs are templates (`@LISTEN@`) their runner fills.
    let text = regex::Regex::new(r"@[A-Z_]+@")
        .expect("regex")
        .replace_all(&text, "x");
    serde_saphyr::from_str::<serde_json::Value>(&text).expect("the file is YAML")
}

fn errors(schema: &serde_json::Value, config: &serde_json::Value) -> Vec<String> {
    let validator = jsonschema::validator_for(schema).expect("a valid JSON Schema");
    validator
        .iter_errors(config)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[test]
fn the_committed_schema_is_what_sidecache_schema_prints() {
    let committed = std::fs::read_to_string(repo("config/sidecache.schema.json"))
        .expect("config/sidecache.schema.json");
    let committed: serde_json::Value = serde_json::from_str(&committed).expect("JSON");
    assert!(
        committed == printed_schema(),
        "config/sidecache.schema.json is stale: run `sidecache schema > config/sidecache.schema.json`"
    );
}

#[test]
fn every_config_in_the_repository_validates() {
    let schema = printed_schema();
    let mut files: Vec<String> = std::fs::read_dir(repo("config"))
        .expect("config/")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml"))
        .map(|n| format!("config/{n}"))
        .collect();
    files.extend(
        [
            "examples/compose-sidecache.yaml",
            "tests/conformance/origin.yaml",
            "tests/conformance/rules.yaml",
        ]
        .map(str::to_owned),
    );
    assert!(files.len() >= 6, "{files:?}");
    for file in &files {
        let text = std::fs::read_to_string(repo(file)).expect("readable");
        let found = errors(&schema, &config_json(&text));
        assert!(found.is_empty(), "{file} does not validate: {found:#?}");
    }
    // The Kubernetes ConfigMap carries a config as text.
    let map =
        std::fs::read_to_string(repo("examples/kubernetes/configmap.yaml")).expect("readable");
    let map: serde_json::Value = serde_saphyr::from_str(&map).expect("YAML");
    let data = map["data"].as_object().expect("a ConfigMap with data");
    let embedded: Vec<&serde_json::Value> = data.values().collect();
    assert!(!embedded.is_empty());
    for text in embedded {
        let text = text.as_str().expect("text");
        let found = errors(&schema, &config_json(text));
        assert!(
            found.is_empty(),
            "the ConfigMap's config does not validate: {found:#?}"
        );
    }
}

#[test]
fn the_schema_refuses_what_the_loader_refuses() {
    let schema = printed_schema();
    let base = "version: 1\nlisten: 127.0.0.1:1\nadmin: { listen: 127.0.0.1:2 }\n\
                upstream: { url: \"http://127.0.0.1:3\" }\n";
    let ok = format!("{base}routes: [{{ name: a, path: \"/a/{{id}}\", params: {{ id: \"[0-9]+\" }}, ttl: 60s }}]\n");
    assert_eq!(errors(&schema, &config_json(&ok)), Vec::<String>::new());
    for (bad, why) in [
        (format!("{base}lisen: x\n"), "an unknown key"),
        (
            format!("{base}routes: [{{ name: a, path: /a, ttl: 60 seconds }}]\n"),
            "a bad duration",
        ),
        (format!("{base}fill: {{ max_body: lots }}\n"), "a bad size"),
        ("listen: 127.0.0.1:1\n".to_owned(), "missing required keys"),
        (
            format!("{base}invalidation: {{ capture: {{ mode: sometimes, tables: [] }} }}\n"),
            "an unknown capture mode",
        ),
    ] {
        assert!(
            !errors(&schema, &config_json(&bad)).is_empty(),
            "{why} passes the schema"
        );
    }
}
