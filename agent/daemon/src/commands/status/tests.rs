use serde_json::json;

use super::clock;
use super::text::{Source, human_bytes, render, state};

const NOW: u64 = 1_795_455_919_570; // 2026-11-23T17:45:19Z

fn staged_and_published() -> serde_json::Value {
    json!({"volumes": [{
        "volume_id": "vol-1",
        "staged": {"staging_path": "/mnt/ebs-node-agent/stage/demo", "device": "/dev/loop3",
                   "progress": "complete", "readonly": false,
                   "access": {"type": "mount", "fs_type": "ext4", "mount_flags": []}},
        "published": [{"target_path": "/mnt/ebs-node-agent/pods/demo", "readonly": true,
                       "progress": "complete"}],
        "filesystem": {"fs_type": "ext4", "uuid": "325e5ca4-0000-4000-8000-000000000001",
                       "state": "done"},
        "last_step": {"op": "publish", "step": "published", "phase": "done",
                      "at_unix_ms": 1_795_455_739_570u64},
    }], "loop_volumes": [{"volume_id": "vol-1", "name": "demo", "capacity_bytes": 1u64 << 30,
                          "file": "/var/lib/ebs-node-agent/loop/vol-1.img",
                          "attached": "/dev/loop3"}]})
}

#[test]
fn text_is_aligned_words_and_times_without_debug_quotes() {
    let out = render(
        &staged_and_published(),
        &Source::Agent("unix:///run/ebs-node-agent/csi.sock".into()),
        NOW,
    );
    let expected = "\
from the running agent on unix:///run/ebs-node-agent/csi.sock

volume vol-1
  state         staged and published
  filesystem    ext4, UUID 325e5ca4-0000-4000-8000-000000000001, formatted by the agent
  device        /dev/loop3
  staged at     /mnt/ebs-node-agent/stage/demo (read-write, mounted)
  published at  /mnt/ebs-node-agent/pods/demo (read-only)
  last step     publish step published: done, 2026-11-23T17:42:19Z (3 min ago)

loop volume demo
  volume id     vol-1
  size          1 GiB
  file          /var/lib/ebs-node-agent/loop/vol-1.img
  attached      /dev/loop3
";
    assert_eq!(out, expected);
    assert!(!out.contains('"'), "no Debug-quoted strings: {out}");
}

#[test]
fn unfinished_steps_say_who_finishes_them() {
    let mut v = staged_and_published()["volumes"][0].clone();
    v["staged"]["progress"] = json!("in_progress");
    v["published"] = json!([]);
    v["last_step"] = json!({"op": "stage", "step": "mount", "phase": "intent", "at_unix_ms": 1});
    assert_eq!(
        state(&v, false),
        "stage interrupted at mount: the next NodeStage or start-up finishes it"
    );
    assert!(state(&v, true).starts_with("stage at mount, not finished: running now"));
    v["last_step"]["phase"] = json!("failed");
    assert!(state(&v, false).starts_with("stage failed at mount:"));
    v["last_step"]["phase"] = json!("done");
    assert_eq!(
        state(&v, false),
        "stage not finished: the next NodeStage or start-up finishes it"
    );
    v["staged"] = json!(null);
    assert!(state(&v, false).starts_with("not staged (its filesystem record stays"));
    v["filesystem"]["state"] = json!("intent");
    assert!(state(&v, false).contains("format was interrupted"));
}

#[test]
fn empty_state_and_file_source() {
    let out = render(
        &json!({"volumes": [], "loop_volumes": []}),
        &Source::File("/var/lib/ebs-node-agent/state.redb".into()),
        NOW,
    );
    assert_eq!(
        out,
        "from the state file /var/lib/ebs-node-agent/state.redb (no agent answered)\n\n\
         no staged or published volumes\n"
    );
}

#[test]
fn sizes_and_times() {
    assert_eq!(human_bytes(512), "512 bytes");
    assert_eq!(human_bytes(64 << 20), "64 MiB");
    assert_eq!(human_bytes(3 << 29), "1.5 GiB");
    assert_eq!(clock::iso8601(NOW), "2026-11-23T17:45:19Z");
}
