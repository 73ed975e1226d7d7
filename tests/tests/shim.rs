//! The Controller shim of the ebs backend: every Controller call forwarded to a stand-in upstream
//! controller (unix socket, TLS, mutual TLS), errors and deadlines passed through, recovery after
//! the upstream restarts, refusals of wrong certificates and wrong flag combinations, node mode
//! without any upstream, and the latency the extra hop adds.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use ebs_tests::csi_req::*;
use ebs_tests::fake_controller::FakeController;
use ebs_tests::*;

use csi::controller_client::ControllerClient;
use csi::volume_capability::access_mode::Mode;
use tonic::transport::{Certificate, Channel, Identity, ServerTlsConfig};
use tonic::{Code, Request};

const SECRET: &str = "s3cr3t-never-in-logs";

fn shim_opts(upstream: &str, extra: &[&str]) -> AgentOpts {
    let mut args: Vec<String> = ["--backend", "ebs", "--mode", "controller"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["--controller-upstream".to_string(), upstream.to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    AgentOpts {
        args,
        ..Default::default()
    }
}

fn unix_url(path: &std::path::Path) -> String {
    format!("unix://{}", path.display())
}

fn secrets() -> HashMap<String, String> {
    HashMap::from([("key".to_string(), SECRET.to_string())])
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn topology(zone: &str) -> csi::Topology {
    csi::Topology {
        segments: map(&[("topology.ebs.csi.aws.com/zone", zone)]),
    }
}

fn volume(id: &str) -> csi::Volume {
    csi::Volume {
        capacity_bytes: 5 << 30,
        volume_id: id.into(),
        volume_context: map(&[("fsType", "xfs")]),
        content_source: Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: "snap-1".into(),
                },
            )),
        }),
        accessible_topology: vec![topology("eu-west-1a")],
    }
}

fn snapshot(id: &str) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: 1 << 30,
        snapshot_id: id.into(),
        source_volume_id: "vol-0abc".into(),
        creation_time: Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 42,
        }),
        ready_to_use: true,
        group_snapshot_id: "group-1".into(),
    }
}

fn last_like<T: Clone + 'static>(
    fake: &FakeController,
    rpc: &str,
    _like: &T,
) -> Option<(T, tonic::metadata::MetadataMap)> {
    fake.last::<T>(rpc)
}

/// Sends one request through `client` with trace metadata and checks that the upstream saw the
/// request and metadata unchanged and that its canned response came back unchanged.
macro_rules! check_forwarded {
    ($client:expr, $fake:expr, $method:ident, $rpc:literal, $req:expr, $resp:expr) => {{
        let req = $req;
        let resp = $resp;
        $fake.reply($rpc, resp.clone());
        let mut call = Request::new(req.clone());
        call.metadata_mut()
            .insert("x-trace-id", concat!("trace-", $rpc).parse().unwrap());
        call.metadata_mut().insert_bin(
            "x-blob-bin",
            tonic::metadata::MetadataValue::from_bytes(b"\x00\x01\xff"),
        );
        let got = $client
            .$method(call)
            .await
            .unwrap_or_else(|e| panic!("{} through the shim: {e:?}", $rpc));
        assert_eq!(
            got.get_ref(),
            &resp,
            "{}: response changed on the way",
            $rpc
        );
        assert_eq!(
            got.metadata()
                .get("x-fake-upstream")
                .map(|v| v.to_str().unwrap()),
            Some("answered"),
            "{}: response metadata lost",
            $rpc
        );
        let (seen, md) =
            last_like(&$fake, $rpc, &req).unwrap_or_else(|| panic!("{} not forwarded", $rpc));
        assert_eq!(seen, req, "{}: request changed on the way", $rpc);
        assert_eq!(md.get("x-trace-id").unwrap(), concat!("trace-", $rpc));
        assert_eq!(
            md.get_bin("x-blob-bin")
                .unwrap()
                .to_bytes()
                .unwrap()
                .as_ref(),
            b"\x00\x01\xff"
        );
    }};
}

async fn check_all_rpcs(client: &mut ControllerClient<Channel>, fake: &FakeController) {
    let cap = mount_cap("xfs", Mode::SingleNodeWriter);
    check_forwarded!(
        client,
        fake,
        create_volume,
        "CreateVolume",
        csi::CreateVolumeRequest {
            name: "pvc-1234".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 5 << 30,
                limit_bytes: 10 << 30
            }),
            volume_capabilities: vec![cap.clone(), block_cap(Mode::MultiNodeMultiWriter)],
            parameters: map(&[("type", "gp3"), ("iops", "4000")]),
            secrets: secrets(),
            volume_content_source: volume("x").content_source,
            accessibility_requirements: Some(csi::TopologyRequirement {
                requisite: vec![topology("eu-west-1a"), topology("eu-west-1b")],
                preferred: vec![topology("eu-west-1b")],
            }),
            mutable_parameters: map(&[("throughput", "250")]),
        },
        csi::CreateVolumeResponse {
            volume: Some(volume("vol-0abc"))
        }
    );
    check_forwarded!(
        client,
        fake,
        delete_volume,
        "DeleteVolume",
        csi::DeleteVolumeRequest {
            volume_id: "vol-0abc".into(),
            secrets: secrets()
        },
        csi::DeleteVolumeResponse {}
    );
    check_forwarded!(
        client,
        fake,
        controller_publish_volume,
        "ControllerPublishVolume",
        csi::ControllerPublishVolumeRequest {
            volume_id: "vol-0abc".into(),
            node_id: "i-0123456789abcdef0".into(),
            volume_capability: Some(cap.clone()),
            readonly: true,
            secrets: secrets(),
            volume_context: map(&[("fsType", "xfs")]),
        },
        csi::ControllerPublishVolumeResponse {
            publish_context: map(&[("devicePath", "/dev/xvdba")])
        }
    );
    check_forwarded!(
        client,
        fake,
        controller_unpublish_volume,
        "ControllerUnpublishVolume",
        csi::ControllerUnpublishVolumeRequest {
            volume_id: "vol-0abc".into(),
            node_id: "i-0123456789abcdef0".into(),
            secrets: secrets(),
        },
        csi::ControllerUnpublishVolumeResponse {}
    );
    check_forwarded!(
        client,
        fake,
        validate_volume_capabilities,
        "ValidateVolumeCapabilities",
        csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "vol-0abc".into(),
            volume_context: map(&[("a", "b")]),
            volume_capabilities: vec![cap.clone()],
            parameters: map(&[("type", "io2")]),
            secrets: secrets(),
            mutable_parameters: map(&[("iops", "3000")]),
        },
        csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: map(&[("a", "b")]),
                volume_capabilities: vec![cap.clone()],
                parameters: map(&[("type", "io2")]),
                mutable_parameters: map(&[("iops", "3000")]),
            }),
            message: "confirmed by upstream".into(),
        }
    );
    check_forwarded!(
        client,
        fake,
        list_volumes,
        "ListVolumes",
        csi::ListVolumesRequest {
            max_entries: 7,
            starting_token: "tok-3".into()
        },
        csi::ListVolumesResponse {
            entries: vec![csi::list_volumes_response::Entry {
                volume: Some(volume("vol-1")),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: vec!["i-1".into(), "i-2".into()],
                    volume_condition: Some(csi::VolumeCondition {
                        abnormal: true,
                        message: "degraded".into()
                    }),
                }),
            }],
            next_token: "tok-4".into(),
        }
    );
    check_forwarded!(
        client,
        fake,
        get_capacity,
        "GetCapacity",
        csi::GetCapacityRequest {
            volume_capabilities: vec![cap.clone()],
            parameters: map(&[("type", "gp3")]),
            accessible_topology: Some(topology("eu-west-1c")),
        },
        csi::GetCapacityResponse {
            available_capacity: 1 << 40,
            maximum_volume_size: Some(16 << 40),
            minimum_volume_size: Some(1 << 30),
        }
    );
    check_forwarded!(
        client,
        fake,
        controller_get_capabilities,
        "ControllerGetCapabilities",
        csi::ControllerGetCapabilitiesRequest {},
        csi::ControllerGetCapabilitiesResponse {
            capabilities: vec![csi::ControllerServiceCapability {
                r#type: Some(csi::controller_service_capability::Type::Rpc(
                    csi::controller_service_capability::Rpc {
                        r#type: csi::controller_service_capability::rpc::Type::ModifyVolume as i32,
                    },
                )),
            }],
        }
    );
    check_forwarded!(
        client,
        fake,
        create_snapshot,
        "CreateSnapshot",
        csi::CreateSnapshotRequest {
            source_volume_id: "vol-0abc".into(),
            name: "snapshot-1".into(),
            secrets: secrets(),
            parameters: map(&[("tagSpecification_1", "k=v")]),
        },
        csi::CreateSnapshotResponse {
            snapshot: Some(snapshot("snap-1"))
        }
    );
    check_forwarded!(
        client,
        fake,
        delete_snapshot,
        "DeleteSnapshot",
        csi::DeleteSnapshotRequest {
            snapshot_id: "snap-1".into(),
            secrets: secrets()
        },
        csi::DeleteSnapshotResponse {}
    );
    check_forwarded!(
        client,
        fake,
        list_snapshots,
        "ListSnapshots",
        csi::ListSnapshotsRequest {
            max_entries: 3,
            starting_token: "t".into(),
            source_volume_id: "vol-0abc".into(),
            snapshot_id: "snap-1".into(),
            secrets: secrets(),
        },
        csi::ListSnapshotsResponse {
            entries: vec![csi::list_snapshots_response::Entry {
                snapshot: Some(snapshot("snap-1"))
            }],
            next_token: "t2".into(),
        }
    );
    check_forwarded!(
        client,
        fake,
        get_snapshot,
        "GetSnapshot",
        csi::GetSnapshotRequest {
            snapshot_id: "snap-1".into(),
            secrets: secrets()
        },
        csi::GetSnapshotResponse {
            snapshot: Some(snapshot("snap-1"))
        }
    );
    check_forwarded!(
        client,
        fake,
        controller_expand_volume,
        "ControllerExpandVolume",
        csi::ControllerExpandVolumeRequest {
            volume_id: "vol-0abc".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 20 << 30,
                limit_bytes: 0
            }),
            secrets: secrets(),
            volume_capability: Some(cap.clone()),
        },
        csi::ControllerExpandVolumeResponse {
            capacity_bytes: 20 << 30,
            node_expansion_required: true
        }
    );
    check_forwarded!(
        client,
        fake,
        controller_get_volume,
        "ControllerGetVolume",
        csi::ControllerGetVolumeRequest {
            volume_id: "vol-0abc".into()
        },
        csi::ControllerGetVolumeResponse {
            volume: Some(volume("vol-0abc")),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: vec!["i-1".into()],
                volume_condition: Some(csi::VolumeCondition {
                    abnormal: false,
                    message: "ok".into()
                }),
            }),
        }
    );
    check_forwarded!(
        client,
        fake,
        controller_modify_volume,
        "ControllerModifyVolume",
        csi::ControllerModifyVolumeRequest {
            volume_id: "vol-0abc".into(),
            secrets: secrets(),
            mutable_parameters: map(&[("iops", "6000"), ("throughput", "500")]),
        },
        csi::ControllerModifyVolumeResponse {}
    );
}

#[tokio::test]
async fn every_controller_rpc_is_forwarded_unchanged_over_a_unix_socket() {
    let scratch = Scratch::new("shim-unix");
    let fake = FakeController::default();
    let sock = scratch.join("upstream.sock");
    let _served = fake.serve_unix(&sock);
    let agent = Agent::start(&scratch, shim_opts(&unix_url(&sock), &[])).await;
    let mut client = agent.controller().await;
    check_all_rpcs(&mut client, &fake).await;
    let log = agent.log_text();
    assert!(!log.contains(SECRET), "a secret reached the log:\n{log}");
    assert!(
        log.contains("ControllerModifyVolume"),
        "one line per call:\n{log}"
    );
}

#[tokio::test]
async fn upstream_errors_come_back_unchanged() {
    let scratch = Scratch::new("shim-errors");
    let fake = FakeController::default();
    let sock = scratch.join("upstream.sock");
    let _served = fake.serve_unix(&sock);
    let agent = Agent::start(&scratch, shim_opts(&unix_url(&sock), &[])).await;
    let mut client = agent.controller().await;
    let cases = [
        (
            Code::ResourceExhausted,
            "volume quota reached: 5000 of 5000 gp3 volumes",
        ),
        (Code::NotFound, "volume vol-0abc not found"),
        (Code::Aborted, "an operation on vol-0abc is pending"),
        (
            Code::FailedPrecondition,
            "volume is attached to i-0fff ünïcödé",
        ),
    ];
    for (code, message) in cases {
        fake.fail("DeleteVolume", code, message);
        let err = client
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: "vol-0abc".into(),
                secrets: secrets(),
            })
            .await
            .unwrap_err();
        assert_eq!((err.code(), err.message()), (code, message));
        assert_eq!(err.details(), format!("details: {message}").as_bytes());
        assert_eq!(err.metadata().get("x-upstream-error").unwrap(), "1");
    }
    // An upstream answer is not a broken link: the next call is forwarded at once.
    fake.fail("DeleteVolume", Code::Unavailable, "EC2 API throttled");
    let before = fake.count();
    for _ in 0..3 {
        let err = client
            .delete_volume(csi::DeleteVolumeRequest::default())
            .await
            .unwrap_err();
        assert_eq!(
            (err.code(), err.message()),
            (Code::Unavailable, "EC2 API throttled")
        );
    }
    assert_eq!(fake.count(), before + 3);
}

#[tokio::test]
async fn the_callers_deadline_reaches_the_upstream_and_calls_do_not_queue() {
    let scratch = Scratch::new("shim-deadline");
    let fake = FakeController::default();
    let sock = scratch.join("upstream.sock");
    let _served = fake.serve_unix(&sock);
    let agent = Agent::start(&scratch, shim_opts(&unix_url(&sock), &[])).await;
    let mut client = agent.controller().await;
    fake.delay("CreateVolume", Duration::from_secs(5));

    let mut call = Request::new(csi::CreateVolumeRequest {
        name: "slow".into(),
        ..Default::default()
    });
    call.set_timeout(Duration::from_millis(400));
    let started = Instant::now();
    let err = client.create_volume(call).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "the deadline was not kept: {took:?}"
    );
    let (_, md) = fake
        .last::<csi::CreateVolumeRequest>("CreateVolume")
        .expect("forwarded");
    let upstream_timeout = md
        .get("grpc-timeout")
        .expect("the upstream saw no deadline")
        .to_str()
        .unwrap()
        .to_string();
    let (n, unit) = upstream_timeout.split_at(upstream_timeout.len() - 1);
    let n: u64 = n.parse().unwrap();
    let seen = match unit {
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        "S" => Duration::from_secs(n),
        other => panic!("unexpected unit {other}"),
    };
    assert!(
        seen > Duration::ZERO && seen <= Duration::from_millis(400),
        "upstream deadline {upstream_timeout}"
    );

    // A slow call does not hold up the others (no head-of-line blocking).
    let mut slow_client = client.clone();
    let slow = tokio::spawn(async move {
        let mut call = Request::new(csi::CreateVolumeRequest::default());
        call.set_timeout(Duration::from_secs(3));
        slow_client.create_volume(call).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    for _ in 0..20 {
        client
            .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
            .expect("fast call");
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "fast calls waited behind the slow one: {:?}",
        started.elapsed()
    );
    slow.abort();
}

async fn call_until_ok(
    client: &mut ControllerClient<Channel>,
    within: Duration,
) -> Vec<tonic::Status> {
    let deadline = Instant::now() + within;
    let mut errors = Vec::new();
    loop {
        match client
            .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
        {
            Ok(_) => return errors,
            Err(e) => errors.push(e),
        }
        assert!(Instant::now() < deadline, "no recovery; errors: {errors:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_upstream_that_is_down_or_restarts_is_recovered_without_restarting_the_agent() {
    let scratch = Scratch::new("shim-restart");
    let fake = FakeController::default();
    let sock = scratch.join("upstream.sock");
    // The agent starts while the upstream is not there yet: it starts and serves anyway.
    let agent = Agent::start(&scratch, shim_opts(&unix_url(&sock), &[])).await;
    let mut client = agent.controller().await;
    let err = client
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("controller upstream") && err.message().contains("unreachable"),
        "{}",
        err.message()
    );
    let probe = agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap();
    assert_eq!(
        probe.into_inner().ready,
        Some(true),
        "Probe must not depend on the upstream"
    );

    let served = fake.serve_unix(&sock);
    call_until_ok(&mut client, Duration::from_secs(10)).await;

    // Restart mid-test.
    served.stop().await;
    let err = client
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let _served = fake.serve_unix(&sock);
    let started = Instant::now();
    call_until_ok(&mut client, Duration::from_secs(10)).await;
    eprintln!(
        "recovered {:?} after the upstream came back",
        started.elapsed()
    );
    // Everything works again, with fields intact.
    check_all_rpcs(&mut client, &fake).await;

    let log = agent.log_text();
    assert!(log.contains("node operations do not need it"), "{log}");
    assert!(log.contains("reachable again"), "{log}");
}

/// A CA and leaf certificates, written under the scratch directory as PEM files.
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

#[tokio::test]
async fn node_mode_has_no_controller_and_needs_no_upstream() {
    if !require_root("node_mode_has_no_controller_and_needs_no_upstream") {
        return;
    }
    let scratch = Scratch::new("shim-node");
    let opts = AgentOpts {
        args: vec![
            "--backend".into(),
            "ebs".into(),
            "--mode".into(),
            "node".into(),
        ],
        ..Default::default()
    };
    let agent = Agent::start(&scratch, opts).await;
    let err = agent
        .controller()
        .await
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    let err = agent
        .controller()
        .await
        .create_volume(csi::CreateVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    let caps = agent
        .node()
        .await
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .expect("node service");
    assert!(!caps.into_inner().capabilities.is_empty());
    let probe = agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
}

#[tokio::test]
async fn all_mode_stays_ready_for_node_work_while_the_upstream_is_down() {
    if !require_root("all_mode_stays_ready_for_node_work_while_the_upstream_is_down") {
        return;
    }
    let scratch = Scratch::new("shim-all-down");
    let sock = scratch.join("nobody-listens.sock");
    let opts = AgentOpts {
        args: vec![
            "--backend".into(),
            "ebs".into(),
            "--mode".into(),
            "all".into(),
            "--controller-upstream".into(),
            unix_url(&sock),
        ],
        ..Default::default()
    };
    let agent = Agent::start(&scratch, opts).await;
    let probe = agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
    agent
        .node()
        .await
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .expect("node work goes on");
    let err = agent
        .controller()
        .await
        .create_volume(csi::CreateVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    // The start-up check says so in the log, once.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !agent.log_text().contains("node operations do not need it") {
        assert!(Instant::now() < deadline, "{}", agent.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        agent
            .log_text()
            .matches("controller upstream unreachable")
            .count(),
        1
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
