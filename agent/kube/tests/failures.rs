//! Failures a real API server does not produce on demand, from a TLS double on 127.0.0.1: a
//! server that answers 503 to everything, and one that accepts connections and never answers.
//! The duties must retry within their bounds and end with their log line, never hang or panic.
//! (Everything else is proven against a real kube-apiserver: tests/tests/kube_duties.rs.)

use std::sync::Arc;
use std::time::Duration;

use ebs_node_agent_kube::{Client, InCluster, prestop, taint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

struct Double {
    cfg: InCluster,
    dir: std::path::PathBuf,
}

impl Drop for Double {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TLS server on a free port whose every request gets `answer` (None: no answer at all).
async fn double(name: &str, answer: Option<&'static str>) -> Double {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let issuer =
        rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let dir = std::env::temp_dir().join(format!("ebs-kube-double-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), "test-token").unwrap();
    std::fs::write(dir.join("ca.crt"), issuer.pem()).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = [0u8; 4096];
                let _ = tls.read(&mut buf).await;
                match answer {
                    Some(body) => {
                        let resp = format!(
                            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = tls.write_all(resp.as_bytes()).await;
                        let _ = tls.shutdown().await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(3600)).await,
                }
            });
        }
    });
    let env = move |k: &str| match k {
        "KUBERNETES_SERVICE_HOST" => Some("127.0.0.1".to_string()),
        "KUBERNETES_SERVICE_PORT" => Some(port.to_string()),
        _ => None,
    };
    let cfg = InCluster::detect(env, &dir, Some("kd-node")).unwrap();
    Double { cfg, dir }
}

const BUSY: &str = r#"{"kind":"Status","message":"etcd \u001b[31mleader changed","code":503}"#;

#[tokio::test]
async fn a_failing_server_ends_the_taint_window_with_its_reason() {
    let d = double("503", Some(BUSY)).await;
    let client = Client::new(&d.cfg).unwrap();
    let mut s = taint::Settings::new("ebs.csi.aws.com");
    s.window = Duration::from_secs(3);
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        taint::remove_startup_taint(&client, "kd-node", &s),
    )
    .await
    .expect("the window bounds the retries");
    let taint::Outcome::GaveUp(why) = out else {
        panic!("{out:?}")
    };
    assert!(why.contains("503") && why.contains("giving up"), "{why}");
    // The server's message is outside input: its terminal escape is escaped.
    assert!(!why.contains('\u{1b}'), "{why:?}");
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let d = double("mute", None).await;
    let mut client = Client::new(&d.cfg).unwrap();
    client.request_timeout = Duration::from_millis(500);
    let err = client
        .get::<serde_json::Value>("/api/v1/nodes/kd-node")
        .await
        .expect_err("no answer");
    assert!(
        matches!(err, ebs_node_agent_kube::Error::Timeout(_)),
        "{err}"
    );
    // pre-stop: the node cannot be read, so it fails at once (no drain known) within its bound.
    let s = prestop::Settings {
        driver: "ebs.csi.aws.com".into(),
        timeout: Duration::from_secs(2),
    };
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        prestop::pre_stop(&client, "kd-node", &s),
    )
    .await
    .expect("bounded");
    assert!(out.is_err(), "{out:?}");
}
