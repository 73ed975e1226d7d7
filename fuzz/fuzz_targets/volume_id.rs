#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ebs_fuzz::volume_id(data));
