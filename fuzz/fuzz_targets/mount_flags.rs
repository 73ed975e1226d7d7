#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ebs_fuzz::mount_flags(data));
