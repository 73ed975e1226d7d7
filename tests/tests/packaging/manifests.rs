//! Reading the shipped manifests: files, YAML as JSON values, containers and flags in them, and
//! the agent's own view of a set of arguments (`--print-config`).

use std::path::{Path, PathBuf};
use std::process::Command;

use ebs_tests::*;
use serde_json::Value;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// What the agent would run with, given these `serve` arguments and only this environment.
pub fn print_config(args: &[String], env: &[(String, String)]) -> Value {
    let out = Command::new(agent_bin())
        .arg("serve")
        .args(args)
        .arg("--print-config")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run agent");
    assert!(
        out.status.success(),
        "serve {args:?} with {env:?} rejected: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("print-config JSON")
}

pub fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

pub fn allowed(cfg: &Value, path: &str) -> bool {
    cfg["allowed_path_prefixes"]
        .as_array()
        .expect("prefixes")
        .iter()
        .any(|p| Path::new(path).starts_with(str_of(p, "prefix")))
}

pub fn is_loopback(addr: &str) -> bool {
    addr.parse::<std::net::SocketAddr>()
        .expect("socket address")
        .ip()
        .is_loopback()
}

pub fn shipped_files(ext: &[&str]) -> Vec<PathBuf> {
    fn walk(dir: &Path, ext: &[&str], out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, ext, out);
            } else if p.extension().is_some_and(|x| ext.iter().any(|w| x == *w)) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join("packaging"), ext, &mut out);
    out.sort();
    out
}

// ---- YAML -------------------------------------------------------------------------------------

pub fn yaml_to_json(y: &yaml_rust2::Yaml) -> Value {
    use yaml_rust2::Yaml;
    match y {
        Yaml::Real(r) => r.parse::<f64>().map(Value::from).unwrap_or(Value::Null),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::String(s) => Value::from(s.clone()),
        Yaml::Boolean(b) => Value::from(*b),
        Yaml::Array(a) => Value::Array(a.iter().map(yaml_to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| (k.as_str().expect("string key").to_string(), yaml_to_json(v)))
                .collect(),
        ),
        _ => Value::Null,
    }
}

pub fn yaml_docs(rel: &str) -> Vec<Value> {
    let docs = yaml_rust2::YamlLoader::load_from_str(&read(rel))
        .unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"));
    docs.iter().map(yaml_to_json).collect()
}

pub fn find<'a>(items: &'a Value, name: &str) -> &'a Value {
    items
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no item named {name} in {items}"))
}

pub fn flag<'a>(args: &'a Value, name: &str) -> &'a str {
    let prefix = format!("--{name}=");
    args.as_array()
        .and_then(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .find_map(|s| s.strip_prefix(&prefix))
        })
        .unwrap_or_else(|| panic!("no {prefix} in {args}"))
}

/// kubelet's `$(VAR)` expansion of container arguments.
pub fn expand(arg: &str, env: &[(String, String)]) -> String {
    env.iter().fold(arg.to_string(), |a, (k, v)| {
        a.replace(&format!("$({k})"), v)
    })
}

/// The container's environment as kubelet sets it on a node: downward-API values filled in
/// from `labels` (absent labels give an empty value).
pub fn container_env(c: &Value, labels: &[(&str, &str)]) -> Vec<(String, String)> {
    c["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            let name = str_of(&e["name"], "name").to_string();
            let value = match e["value"].as_str() {
                Some(v) => v.to_string(),
                None => {
                    let path = str_of(&e["valueFrom"]["fieldRef"]["fieldPath"], "fieldPath");
                    if path == "spec.nodeName" {
                        "ip-10-0-0-1.ec2.internal".to_string()
                    } else {
                        labels
                            .iter()
                            .find(|(l, _)| path == format!("metadata.labels['{l}']"))
                            .map(|(_, v)| v.to_string())
                            .unwrap_or_default()
                    }
                }
            };
            (name, value)
        })
        .collect()
}

/// What the agent would run with: the container's command and arguments as kubelet runs them.
pub fn print_config_argv(argv: &[String], env: &[(String, String)]) -> Value {
    let out = Command::new(agent_bin())
        .args(argv)
        .arg("--print-config")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run agent");
    assert!(
        out.status.success(),
        "{argv:?} with {env:?} rejected: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("print-config JSON")
}
