#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ebs_node_agent::fuzzing::sysfs_strings(data));
