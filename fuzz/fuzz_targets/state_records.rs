#![no_main]
//! The state file's records, decoded from bytes as the store does (serde_json): the first byte
//! picks the record type. Whatever decodes must encode and decode back to itself.

use ebs_node_core::records::{FormatRecord, LoopVolume, Publication, StagedVolume, StepRecord};
use serde::{Serialize, de::DeserializeOwned};

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
    if let Ok(record) = serde_json::from_slice::<T>(bytes) {
        let encoded = serde_json::to_vec(&record).expect("a decoded record encodes");
        let again: T = serde_json::from_slice(&encoded).expect("an encoded record decodes");
        assert_eq!(record, again);
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 5 {
        0 => round_trip::<LoopVolume>(bytes),
        1 => round_trip::<FormatRecord>(bytes),
        2 => round_trip::<StagedVolume>(bytes),
        3 => round_trip::<Publication>(bytes),
        _ => round_trip::<StepRecord>(bytes),
    }
});
