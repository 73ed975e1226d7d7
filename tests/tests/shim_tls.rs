//! The Controller shim over TCP: TLS and mutual TLS with certificates made in the test, refused
//! certificates, plain http only when asked for, refused flag combinations, and the latency the
//! extra hop adds to a call.

use std::process::Command;
use std::time::{Duration, Instant};

use ebs_tests::controller_cases::*;
use ebs_tests::csi_req::*;
use ebs_tests::fake_controller::FakeController;
use ebs_tests::*;

use csi::controller_client::ControllerClient;
use csi::volume_capability::access_mode::Mode;
use tonic::Code;
use tonic::transport::{Certificate, Channel, Identity, ServerTlsConfig};

struct Pki {
    ca: std::path::PathBuf,
    ca_pem: String,
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new(scratch: &Scratch, name: &str) -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let issuer =
            rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
                .unwrap();
        let ca = scratch.join(&format!("{name}-ca.pem"));
        std::fs::write(&ca, issuer.pem()).unwrap();
        Pki {
            ca,
            ca_pem: issuer.pem(),
            issuer,
        }
    }

    /// (cert PEM, key PEM, cert path, key path)
    fn leaf(
        &self,
        scratch: &Scratch,
        name: &str,
        server: bool,
    ) -> (String, String, std::path::PathBuf, std::path::PathBuf) {
        let sans = if server {
            vec!["127.0.0.1".to_string(), "localhost".to_string()]
        } else {
            vec![]
        };
        let mut params = rcgen::CertificateParams::new(sans).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cp, kp) = (
            scratch.join(&format!("{name}.crt")),
            scratch.join(&format!("{name}.key")),
        );
        std::fs::write(&cp, cert.pem()).unwrap();
        std::fs::write(&kp, key.serialize_pem()).unwrap();
        (cert.pem(), key.serialize_pem(), cp, kp)
    }
}

#[tokio::test]
async fn tls_and_mutual_tls_upstreams_and_refused_certificates() {
    let scratch = Scratch::new("shim-tls");
    let pki = Pki::new(&scratch, "good");
    let rogue = Pki::new(&scratch, "rogue");
    let (srv_cert, srv_key, _, _) = pki.leaf(&scratch, "server", true);
    let (_, _, cli_cert, cli_key) = pki.leaf(&scratch, "client", false);
    let (rogue_cert, rogue_key, _, _) = rogue.leaf(&scratch, "rogue-server", true);
    let ca = pki.ca.to_str().unwrap().to_string();
    let server_identity = Identity::from_pem(&srv_cert, &srv_key);

    // TLS: the agent verifies the server against --upstream-ca.
    let fake = FakeController::default();
    let (_tls, addr) = fake
        .serve_tcp(Some(
            ServerTlsConfig::new().identity(server_identity.clone()),
        ))
        .await;
    let agent = Agent::start(
        &scratch,
        shim_opts(&format!("https://{addr}"), &["--upstream-ca", &ca]),
    )
    .await;
    let mut client = agent.controller().await;
    check_all_rpcs(&mut client, &fake).await;
    drop(agent);

    // Mutual TLS: the upstream wants a client certificate signed by the CA.
    let mtls_fake = FakeController::default();
    let mtls = ServerTlsConfig::new()
        .identity(server_identity.clone())
        .client_ca_root(Certificate::from_pem(&pki.ca_pem));
    let (_mtls, mtls_addr) = mtls_fake.serve_tcp(Some(mtls)).await;
    let url = format!("https://{mtls_addr}");
    let scratch_m = Scratch::new("shim-mtls");
    let agent = Agent::start(
        &scratch_m,
        shim_opts(
            &url,
            &[
                "--upstream-ca",
                &ca,
                "--upstream-cert",
                cli_cert.to_str().unwrap(),
                "--upstream-key",
                cli_key.to_str().unwrap(),
            ],
        ),
    )
    .await;
    let mut client = agent.controller().await;
    check_all_rpcs(&mut client, &mtls_fake).await;
    drop(agent);

    // Without a client certificate the upstream refuses the agent.
    let before = mtls_fake.count();
    let scratch_n = Scratch::new("shim-mtls-nocert");
    let agent = Agent::start(&scratch_n, shim_opts(&url, &["--upstream-ca", &ca])).await;
    let err = agent
        .controller()
        .await
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    eprintln!("missing client certificate: {}", err.message());
    assert_eq!(
        mtls_fake.count(),
        before,
        "a call got through without a client certificate"
    );
    drop(agent);

    // A server whose certificate another CA signed is refused.
    let rogue_fake = FakeController::default();
    let (_rogue, rogue_addr) = rogue_fake
        .serve_tcp(Some(
            ServerTlsConfig::new().identity(Identity::from_pem(&rogue_cert, &rogue_key)),
        ))
        .await;
    let scratch_r = Scratch::new("shim-rogue");
    let agent = Agent::start(
        &scratch_r,
        shim_opts(&format!("https://{rogue_addr}"), &["--upstream-ca", &ca]),
    )
    .await;
    let err = agent
        .controller()
        .await
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("certificate"), "{}", err.message());
    eprintln!("wrong server certificate: {}", err.message());
    assert_eq!(rogue_fake.count(), 0);
}

fn serve_exit(args: &[&str], scratch: &Scratch) -> (Option<i32>, String) {
    let out = Command::new(agent_bin())
        .arg("serve")
        .arg("--endpoint")
        .arg(format!("unix://{}", scratch.join("csi.sock").display()))
        .arg("--state-dir")
        .arg(scratch.join("state"))
        .args(args)
        .output()
        .expect("run agent");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn wrong_upstream_settings_stop_the_agent_at_start() {
    let scratch = Scratch::new("shim-refusals");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--backend", "ebs", "--mode", "controller"],
            "--controller-upstream",
        ),
        (
            &["--backend", "ebs", "--mode", "all"],
            "--controller-upstream",
        ),
        (
            &[
                "--backend",
                "loop",
                "--controller-upstream",
                "unix:///x.sock",
            ],
            "loop backend",
        ),
        (
            &[
                "--backend",
                "ebs",
                "--controller-upstream",
                "http://127.0.0.1:9",
            ],
            "--upstream-insecure",
        ),
        (
            &[
                "--backend",
                "ebs",
                "--controller-upstream",
                "unix://relative.sock",
            ],
            "absolute",
        ),
        (
            &[
                "--backend",
                "ebs",
                "--controller-upstream",
                "unix:///x.sock",
                "--upstream-ca",
                "/nonexistent.pem",
            ],
            "https://",
        ),
        (
            &[
                "--backend",
                "ebs",
                "--controller-upstream",
                "https://127.0.0.1:9",
                "--upstream-ca",
                "/nonexistent.pem",
            ],
            "/nonexistent.pem",
        ),
        (
            &[
                "--backend",
                "ebs",
                "--controller-upstream",
                "https://127.0.0.1:9",
                "--upstream-cert",
                "/c.pem",
            ],
            "--upstream-key",
        ),
    ];
    for (args, needle) in cases {
        let (code, stderr) = serve_exit(args, &scratch);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn plain_http_upstream_only_with_the_insecure_flag() {
    let scratch = Scratch::new("shim-insecure");
    let fake = FakeController::default();
    let (_served, addr) = fake.serve_tcp(None).await;
    let agent = Agent::start(
        &scratch,
        shim_opts(&format!("http://{addr}"), &["--upstream-insecure"]),
    )
    .await;
    let mut client = agent.controller().await;
    check_all_rpcs(&mut client, &fake).await;
    assert!(
        agent.log_text().contains("plain-text"),
        "{}",
        agent.log_text()
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn time_calls(client: &mut ControllerClient<Channel>, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        client
            .create_volume(csi::CreateVolumeRequest {
                name: "pvc-latency".into(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 1 << 30,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![mount_cap("ext4", Mode::SingleNodeWriter)],
                parameters: map(&[("type", "gp3")]),
                secrets: secrets(),
                ..Default::default()
            })
            .await
            .expect("call");
        out.push(started.elapsed());
    }
    out.sort();
    out
}

/// Measures, in one run, CreateVolume straight to the stand-in upstream and through the agent.
/// Prints the figures; timing is not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_added_by_the_shim() {
    const N: usize = 2000;
    let scratch = Scratch::new("shim-latency");
    let fake = FakeController::default();
    let sock = scratch.join("upstream.sock");
    let _served = fake.serve_unix(&sock);
    fake.reply(
        "CreateVolume",
        csi::CreateVolumeResponse {
            volume: Some(volume("vol-0abc")),
        },
    );
    let agent = Agent::start(&scratch, shim_opts(&unix_url(&sock), &[])).await;
    let mut direct = ControllerClient::new(channel(&sock).await.expect("direct"));
    let mut shim = agent.controller().await;
    time_calls(&mut direct, 200).await;
    time_calls(&mut shim, 200).await;
    // Interleave rounds so both see the same machine load.
    let (mut d_all, mut s_all) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        d_all.extend(time_calls(&mut direct, N / 4).await);
        s_all.extend(time_calls(&mut shim, N / 4).await);
    }
    d_all.sort();
    s_all.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (d50, d99, s50, s99) = (
        percentile(&d_all, 0.5),
        percentile(&d_all, 0.99),
        percentile(&s_all, 0.5),
        percentile(&s_all, 0.99),
    );
    eprintln!(
        "CreateVolume x{N} over unix sockets: direct p50 {:.0} µs p99 {:.0} µs; through the shim \
         p50 {:.0} µs p99 {:.0} µs; added p50 {:.0} µs p99 {:.0} µs (agent binary: {})",
        us(d50),
        us(d99),
        us(s50),
        us(s99),
        us(s50) - us(d50),
        us(s99) - us(d99),
        agent_bin().display()
    );
}
