//! Whether the agent runs in a Kubernetes pod that may call the API server, and with what.

use std::path::{Path, PathBuf};

/// Where kubelet mounts a pod's service-account token, CA and namespace.
pub const DEFAULT_SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// In-cluster settings: the API server, the token file (re-read at every request: kubelet
/// rotates projected tokens), the CA bundle, and the node this pod runs on.
#[derive(Clone, Debug)]
pub struct InCluster {
    /// `host:port`, an IPv6 host in brackets.
    pub authority: String,
    /// The host alone: the name the server's certificate must carry.
    pub host: String,
    pub token_file: PathBuf,
    pub ca_file: PathBuf,
    pub node_name: String,
}

impl InCluster {
    /// From the environment as kubelet sets it in a pod, and the service-account directory.
    /// `Err` says, in one line, why the duties are off (nothing is wrong on a bare host).
    pub fn detect(
        env: impl Fn(&str) -> Option<String>,
        sa_dir: &Path,
        node_name: Option<&str>,
    ) -> Result<InCluster, String> {
        let set = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let (Some(host), Some(port)) = (
            set("KUBERNETES_SERVICE_HOST"),
            set("KUBERNETES_SERVICE_PORT"),
        ) else {
            return Err("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST/PORT unset)".into());
        };
        let token_file = sa_dir.join("token");
        let ca_file = sa_dir.join("ca.crt");
        for f in [&token_file, &ca_file] {
            if !f.is_file() {
                return Err(format!(
                    "no service-account credentials ({} missing; automountServiceAccountToken off?)",
                    f.display()
                ));
            }
        }
        let Some(node_name) = node_name.filter(|n| !n.trim().is_empty()) else {
            return Err("CSI_NODE_NAME is not set (the downward API's spec.nodeName)".into());
        };
        if !valid_node_name(node_name) {
            return Err(format!("CSI_NODE_NAME {node_name:?} is not a node name"));
        }
        let host = host.trim().to_string();
        let port = port.trim();
        if port.parse::<u16>().is_err() {
            return Err(format!("KUBERNETES_SERVICE_PORT {port:?} is not a port"));
        }
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(InCluster {
            authority,
            host,
            token_file,
            ca_file,
            node_name: node_name.to_string(),
        })
    }
}

/// A DNS subdomain (what Kubernetes accepts as a node name): it goes into request paths, so
/// nothing else may pass.
pub fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("ebs-kube-sa-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("token"), "t").unwrap();
        std::fs::write(d.join("ca.crt"), "c").unwrap();
        d
    }

    #[test]
    fn off_without_any_one_of_the_pods_settings() {
        let dir = sa_dir();
        let env = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.0.0.1".to_string()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_string()),
            _ => None,
        };
        let ok = InCluster::detect(env, &dir, Some("ip-10-0-0-1.ec2.internal")).unwrap();
        assert_eq!(ok.authority, "10.0.0.1:443");
        assert!(InCluster::detect(env, &dir, None).is_err());
        assert!(InCluster::detect(env, &dir, Some("../x")).is_err());
        assert!(InCluster::detect(|_| None, &dir, Some("n")).is_err());
        assert!(InCluster::detect(env, &dir.join("absent"), Some("n")).is_err());
        let v6 = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("fd00::1".to_string()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_string()),
            _ => None,
        };
        assert_eq!(
            InCluster::detect(v6, &dir, Some("n")).unwrap().authority,
            "[fd00::1]:443"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
