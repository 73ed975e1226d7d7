//! The blank proof's other side: what it must accept, and what mkfs must then leave alone.
//! (Its refusals are rows of `refusals::never_format_matrix`.)

use ebs_tests::csi_req::*;
use ebs_tests::*;

use csi::volume_capability::access_mode::Mode;

/// Allocated but zero is blank: 4 MiB of zeroes written into the middle of the device are read
/// and accepted. mkfs then keeps them allocated in the volume file: it never discards (a discard
/// on loop punches holes), so it never destroys what the proof could not see.
#[tokio::test]
async fn zeroed_extents_are_blank_and_mkfs_never_discards() {
    if !require_root("zeroed_extents_are_blank_and_mkfs_never_discards") {
        return;
    }
    let scratch = Scratch::new("zeroed-extents");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    for fs in ["ext4", "xfs"] {
        let vol = create_attached(&agent, fs, 600 << 20).await;
        sh(&format!(
            "dd if=/dev/zero of={} bs=1M seek=300 count=4 conv=notrunc status=none && sync",
            vol.device
        ));
        let file =
            std::fs::File::open(agent.state_dir.join(format!("volumes/{}.img", vol.id))).unwrap();
        let data_from = |at: i64| nix::unistd::lseek(&file, at, nix::unistd::Whence::SeekData);
        assert_eq!(data_from(300 << 20).unwrap(), 300 << 20, "{fs}: allocated");
        let staging = agent.work.join(format!("staging/{fs}"));
        let mut node = agent.node().await;
        node.node_stage_volume(stage_req(
            &vol,
            &staging,
            mount_cap(fs, Mode::SingleNodeWriter),
        ))
        .await
        .unwrap_or_else(|e| panic!("{fs}: zeroes are blank: {e:?}"));
        assert_eq!(
            data_from(302 << 20).unwrap(),
            302 << 20,
            "{fs}: not discarded"
        );
        node.node_unstage_volume(unstage_req(&vol, &staging))
            .await
            .unwrap();
    }
}
