//! Node identity sources against a local IMDS emulator and DMI/sysfs fixture trees: the IMDSv2
//! client, each source, their precedence, and the attach limit from what the host has attached.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ebs_node_agent::nodeinfo::sources::{
    OS_KEY, Resolver, SourceConfig, WELL_KNOWN_ZONE_KEY, ZONE_KEY,
};
use ebs_node_backends::nodeinfo::imds::{ImdsClient, ImdsError};
use ebs_node_backends::nodeinfo::live_limit::StagedSerials;
use ebs_node_backends::nodeinfo::outpost::{
    ACCOUNT_ID_KEY, OUTPOST_ID_KEY, PARTITION_KEY, REGION_KEY,
};
use ebs_node_backends::nodeinfo::{NodeInfo, NodeInfoSource, dmi};
use ebs_node_core::ec2::ebs::{EBS_MODEL, INSTANCE_STORE_MODEL};
use ebs_node_fixture::flat as fixture;
use ebs_tests::Scratch;
use ebs_tests::imds::{Imds, Instance, raw_get_status};

fn client(imds: &Imds, timeout_ms: u64) -> ImdsClient {
    let mut c = ImdsClient::new(&imds.endpoint(), Duration::from_millis(timeout_ms)).unwrap();
    c.backoff = Duration::from_millis(20);
    c
}

fn write_asset_tag(root: &Path, tag: &str) {
    let file = root.join(dmi::ASSET_TAG);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(file, format!("{tag}\n")).unwrap();
}

fn config(sysfs: &Path, imds: Option<ImdsClient>) -> SourceConfig {
    SourceConfig {
        sysfs_root: sysfs.to_path_buf(),
        imds,
        retry_max: Duration::from_millis(100),
        ..Default::default()
    }
}

async fn resolve(cfg: SourceConfig) -> Result<NodeInfo, String> {
    Resolver::new(cfg).round().await
}

#[tokio::test]
async fn imdsv2_token_flow() {
    let imds = Imds::start(Instance::default()).await;
    let found = client(&imds, 1000).identity().await.unwrap();
    assert_eq!(found.instance_id, "i-0feedfacecafe0001");
    assert_eq!(found.instance_type.as_deref(), Some("m5.large"));
    assert_eq!(found.zone.as_deref(), Some("eu-central-1b"));
    assert_eq!(found.region.as_deref(), Some("eu-central-1"));
    assert_eq!(found.network_interfaces, Some(1));
    // One token, every metadata GET carried it, and the emulator does refuse tokenless GETs.
    assert_eq!(imds.switches.token_requests.load(Ordering::SeqCst), 1);
    assert_eq!(imds.switches.tokenless_requests.load(Ordering::SeqCst), 0);
    assert_eq!(
        raw_get_status(imds.port, "/latest/meta-data/instance-id").await,
        401
    );
}

#[tokio::test]
async fn a_hanging_token_call_names_the_hop_limit() {
    let imds = Imds::start(Instance::default()).await;
    imds.set(&imds.switches.hang_token, true);
    let err = client(&imds, 200).identity().await.unwrap_err();
    assert!(matches!(err, ImdsError::TokenTimeout { .. }), "{err:?}");
    assert!(err.to_string().contains("hop limit"), "{err}");
    // Retried a few times, never more.
    assert_eq!(imds.switches.token_requests.load(Ordering::SeqCst), 3);
    assert_eq!(imds.switches.metadata_requests.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn slow_metadata_within_the_timeout_is_waited_for_and_beyond_it_is_an_error() {
    let imds = Imds::start(Instance::default()).await;
    imds.switches.metadata_delay_ms.store(150, Ordering::SeqCst);
    let found = client(&imds, 1000).identity().await.unwrap();
    assert_eq!(found.zone.as_deref(), Some("eu-central-1b"));

    imds.switches
        .metadata_delay_ms
        .store(2000, Ordering::SeqCst);
    let err = client(&imds, 100).identity().await.unwrap_err();
    assert!(matches!(err, ImdsError::Timeout { .. }), "{err:?}");
    assert!(err.to_string().contains("instance-id"), "{err}");
}

#[tokio::test]
async fn unreachable_and_down_imds_are_errors_not_hangs() {
    let imds = Imds::start(Instance::default()).await;
    imds.set(&imds.switches.down, true);
    let err = client(&imds, 500).identity().await.unwrap_err();
    assert!(
        matches!(
            err,
            ImdsError::Unreachable { .. } | ImdsError::Malformed { .. }
        ),
        "{err:?}"
    );
    let port = imds.port;
    drop(imds);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closed = ImdsClient::new(
        &format!("http://127.0.0.1:{port}"),
        Duration::from_millis(300),
    )
    .unwrap();
    let err = closed.identity().await.unwrap_err();
    assert!(err.to_string().contains("unreachable"), "{err}");
}

#[tokio::test]
async fn imds_alone_gives_the_whole_identity() {
    let sysfs = Scratch::new("nodeid-imds-only");
    let imds = Imds::start(Instance::default()).await;
    let info = resolve(config(&sysfs.path, Some(client(&imds, 1000))))
        .await
        .unwrap();
    assert_eq!(info.node_id, "i-0feedfacecafe0001");
    assert_eq!(info.topology[ZONE_KEY], "eu-central-1b");
    assert_eq!(info.topology[WELL_KNOWN_ZONE_KEY], "eu-central-1b");
    assert_eq!(info.topology[OS_KEY], "linux");
    assert_eq!(info.topology.len(), 3, "no Outpost segments off an Outpost");
    // m5.large is not in the table: 27 shared - the root volume, one interface (from IMDS).
    assert_eq!(info.max_volumes, 26);
}

#[tokio::test]
async fn an_outpost_instance_reports_upstreams_four_segments() {
    let sysfs = Scratch::new("nodeid-outpost");
    let imds = Imds::start(Instance {
        outpost_arn: Some(
            "arn:aws:outposts:us-west-2:111122223333:outpost/op-0a1b2c3d4e5f60718".into(),
        ),
        ..Instance::default()
    })
    .await;
    let info = resolve(config(&sysfs.path, Some(client(&imds, 1000))))
        .await
        .unwrap();
    assert_eq!(info.topology[OUTPOST_ID_KEY], "op-0a1b2c3d4e5f60718");
    assert_eq!(info.topology[REGION_KEY], "us-west-2");
    assert_eq!(info.topology[PARTITION_KEY], "aws");
    assert_eq!(info.topology[ACCOUNT_ID_KEY], "111122223333");
    assert_eq!(info.topology.len(), 7);

    // Flags and DMI give the identity: instance metadata is asked only whether this is an
    // Outpost, once.
    let before = imds.asked().len();
    write_asset_tag(&sysfs.path, "i-0123456789abcdef0");
    let cfg = SourceConfig {
        zone: Some("us-west-2a".into()),
        instance_type: Some("m7i.large".into()),
        ..config(&sysfs.path, Some(client(&imds, 1000)))
    };
    let mut r = Resolver::new(cfg);
    let info = r.round().await.unwrap();
    assert_eq!(info.topology[OUTPOST_ID_KEY], "op-0a1b2c3d4e5f60718");
    assert_eq!(imds.asked()[before..], ["outpost-arn".to_string()]);
}

#[tokio::test]
async fn dmi_wins_over_imds_and_flags_win_over_both() {
    let sysfs = Scratch::new("nodeid-precedence");
    write_asset_tag(&sysfs.path, "i-0123456789abcdef0");
    let imds = Imds::start(Instance::default()).await;

    // DMI gives the id; IMDS fills in the zone and the type.
    let info = resolve(config(&sysfs.path, Some(client(&imds, 1000))))
        .await
        .unwrap();
    assert_eq!(info.node_id, "i-0123456789abcdef0");
    assert_eq!(info.topology[ZONE_KEY], "eu-central-1b");

    // Flags beat DMI and IMDS field by field; with id, zone and type given, IMDS is asked only
    // whether this node is on an Outpost.
    let before = imds.asked().len();
    let cfg = SourceConfig {
        node_id: Some("i-0aaaaaaaaaaaaaaaa".into()),
        zone: Some("us-west-2a".into()),
        instance_type: Some("m7i.large".into()),
        ..config(&sysfs.path, Some(client(&imds, 1000)))
    };
    let info = resolve(cfg).await.unwrap();
    assert_eq!(info.node_id, "i-0aaaaaaaaaaaaaaaa");
    assert_eq!(info.topology[ZONE_KEY], "us-west-2a");
    assert_eq!(info.max_volumes, 31, "dedicated 32 - the root volume");
    assert_eq!(
        imds.asked()[before..],
        ["outpost-arn".to_string()],
        "IMDS was asked for what flags said"
    );
}

#[tokio::test]
async fn dmi_and_a_zone_flag_need_no_network() {
    let sysfs = Scratch::new("nodeid-dmi-only");
    write_asset_tag(&sysfs.path, "i-0123456789abcdef0");
    let cfg = SourceConfig {
        zone: Some("ap-south-1a".into()),
        ..config(&sysfs.path, None)
    };
    let info = resolve(cfg).await.unwrap();
    assert_eq!(info.node_id, "i-0123456789abcdef0");
    // Unknown type: upstream's fallback, 27 shared - the root volume.
    assert_eq!(info.max_volumes, 26);
}

#[tokio::test]
async fn no_source_gives_a_hint_that_names_the_flags_and_the_imds_error() {
    let sysfs = Scratch::new("nodeid-nothing");
    let imds = Imds::start(Instance::default()).await;
    imds.set(&imds.switches.hang_token, true);
    let mut r = Resolver::new(config(&sysfs.path, Some(client(&imds, 100))));
    let hint = r.round().await.unwrap_err();
    assert!(hint.contains("--node-id"), "{hint}");
    assert!(hint.contains("--zone"), "{hint}");
    assert!(hint.contains("hop limit"), "{hint}");
    assert!(hint.contains("board_asset_tag"), "{hint}");
    // A source that appears later is picked up by the next round.
    imds.set(&imds.switches.hang_token, false);
    let info = r.round().await.unwrap();
    assert_eq!(info.node_id, "i-0feedfacecafe0001");
}

#[tokio::test]
async fn attach_limit_counts_interfaces_and_unstaged_ebs_from_sysfs() {
    let sysfs = Scratch::new("nodeid-limit");
    let root = &sysfs.path;
    fixture::nvme_disk(root, "nvme0n1", EBS_MODEL, "vol0000000000000root");
    fixture::nvme_disk(root, "nvme1n1", EBS_MODEL, "vol0aaaaaaaaaaaaaaaa");
    fixture::nvme_disk(root, "nvme2n1", EBS_MODEL, "vol0bbbbbbbbbbbbbbbb");
    fixture::nvme_disk(root, "nvme3n1", INSTANCE_STORE_MODEL, "AWS11111");
    fixture::nvme_disk(root, "nvme4n1", INSTANCE_STORE_MODEL, "AWS22222");
    let mut inst = Instance {
        instance_type: "m5d.4xlarge".into(),
        ..Instance::default()
    };
    inst.macs = vec!["0a:1".into(), "0a:2".into(), "0a:3".into()];
    let imds = Imds::start(inst).await;
    let staged: HashSet<String> = ["vol0bbbbbbbbbbbbbbbb".to_string()].into();
    let cfg = SourceConfig {
        staged: StagedSerials::fixed(staged),
        ..config(root, Some(client(&imds, 1000)))
    };
    // m5d.4xlarge: 25 shared (the table already excludes its instance store) - 2 EBS volumes the
    // agent did not stage - 2 interfaces beyond the first.
    assert_eq!(resolve(cfg.clone()).await.unwrap().max_volumes, 21);
    // Reserved slots replace the automatic count, as upstream's flag does; the override wins.
    let reserved = SourceConfig {
        reserved_attachments: Some(5),
        ..cfg.clone()
    };
    assert_eq!(resolve(reserved).await.unwrap().max_volumes, 25 - 5 - 2);
    let forced = SourceConfig {
        attach_limit: Some(3),
        ..cfg.clone()
    };
    assert_eq!(resolve(forced).await.unwrap().max_volumes, 3);
    // Without IMDS the interfaces come from the PCI devices bound to ena.
    fixture::nic(root, "ena", "0000:00:05.0");
    fixture::nic(root, "ena", "0000:00:06.0");
    let no_imds = SourceConfig {
        node_id: Some("i-0123456789abcdef0".into()),
        zone: Some("eu-central-1b".into()),
        instance_type: Some("m5d.4xlarge".into()),
        imds: None,
        ..cfg
    };
    assert_eq!(resolve(no_imds).await.unwrap().max_volumes, 25 - 2 - 1);
}

#[tokio::test]
async fn node_get_info_recounts_the_host_at_every_call_without_imds() {
    let sysfs = Scratch::new("nodeid-live-limit");
    let root = &sysfs.path;
    fixture::nvme_disk(root, "nvme0n1", EBS_MODEL, "vol0000000000000root");
    fixture::nic(root, "ena", "0000:00:05.0");
    let imds = Imds::start(Instance::default()).await;
    let mut r = Resolver::new(config(root, Some(client(&imds, 1000))));
    let info = r.round().await.unwrap();
    let source = NodeInfoSource::missing("looking".into());
    source.set_live(info, std::sync::Arc::new(r.live_limit()));
    let asked = imds.requests();
    // m5.large (27 shared): - root - no extra interface.
    assert_eq!(source.get().unwrap().max_volumes, 26);
    // The VPC CNI attaches two interfaces; a disk is attached by hand.
    fixture::nic(root, "ena", "0000:00:06.0");
    fixture::nic(root, "ena", "0000:00:07.0");
    fixture::nvme_disk(root, "nvme1n1", EBS_MODEL, "vol0cccccccccccccccc");
    assert_eq!(source.get().unwrap().max_volumes, 27 - 2 - 2);
    // They go away again.
    std::fs::remove_dir_all(root.join("bus/pci/drivers/ena/0000:00:07.0")).unwrap();
    std::fs::remove_dir_all(root.join("block/nvme1n1")).unwrap();
    assert_eq!(source.get().unwrap().max_volumes, 27 - 1 - 1);
    assert_eq!(
        imds.requests(),
        asked,
        "NodeGetInfo asked instance metadata"
    );
}
