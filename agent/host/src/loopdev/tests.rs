use super::test_support::{Loop, TempFile, root_or_skip, sh};
use std::os::unix::fs::MetadataExt;

use super::*;

#[test]
fn struct_layouts_match_kernel() {
    assert_eq!(std::mem::offset_of!(LoopInfo64, lo_file_name), 56);
    assert_eq!(std::mem::offset_of!(LoopConfig, info), 8);
}

#[test]
fn file_name_is_truncated_and_nul_terminated() {
    let long = PathBuf::from("/".to_string() + &"x".repeat(100));
    let field = file_name_field(&long);
    assert_eq!(field[62], b'x');
    assert_eq!(field[63], 0);
    let short = file_name_field(Path::new("/a"));
    assert_eq!(&short[..3], b"/a\0");
}

#[test]
fn loop_names() {
    assert_eq!(loop_name(Path::new("/dev/loop12")).unwrap(), "loop12");
    assert!(loop_name(Path::new("/dev/sda")).is_err());
    assert!(loop_name(Path::new("/dev/loop")).is_err());
    assert!(loop_name(Path::new("/dev/loop-control")).is_err());
}

#[test]
fn device_size_of_regular_file() {
    let f = TempFile::sparse("size", 3 << 20);
    assert_eq!(crate::device::size(&f.0).unwrap(), 3 << 20);
}

#[test]
fn attach_inspect_grow_detach() {
    if !root_or_skip("attach_inspect_grow_detach") {
        return;
    }
    let file = TempFile::sparse("loop", 16 << 20);
    let lo = Loop::attach(&file.0);
    assert!(lo.0.to_string_lossy().starts_with("/dev/loop"));
    assert_eq!(crate::device::size(&lo.0).unwrap(), 16 << 20);

    assert_eq!(
        backing_file(&lo.0).unwrap().as_deref(),
        Some(file.0.as_path())
    );
    let meta = std::fs::metadata(&file.0).unwrap();
    let want = (meta.dev(), meta.ino());
    assert_eq!(backing_inode(&lo.0).unwrap(), Some(want));
    assert_eq!(
        find_by_backing_inode(want.0, want.1).unwrap(),
        Some(lo.0.clone())
    );

    std::fs::OpenOptions::new()
        .write(true)
        .open(&file.0)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    set_capacity(&lo.0).unwrap();
    assert_eq!(crate::device::size(&lo.0).unwrap(), 32 << 20);

    // The binding must survive our fds being closed (no autoclear).
    let sysfs_name = format!("/sys/block/{}/loop/autoclear", loop_name(&lo.0).unwrap());
    assert_eq!(std::fs::read_to_string(sysfs_name).unwrap().trim(), "0");

    detach(&lo.0).unwrap();
    // Other tests (or udev) may briefly hold the device open, which turns
    // LOOP_CLR_FD into a deferred detach; wait for the last close.
    // A test running in parallel may take the freed number at once: the device is then bound,
    // to another file.
    let ours = |lo: &Path| backing_inode(lo).unwrap() == Some(want);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ours(&lo.0) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !ours(&lo.0),
        "{} is still bound to the file",
        lo.0.display()
    );
    assert_ne!(
        backing_file(&lo.0).unwrap().as_deref(),
        Some(file.0.as_path())
    );
    assert_eq!(find_by_backing_inode(want.0, want.1).unwrap(), None);
    // Detaching twice is fine (ENXIO). Only while the device is still free: a test running in
    // parallel may have attached its own file to this number meanwhile.
    if backing_file(&lo.0).unwrap().is_none() {
        detach(&lo.0).unwrap();
    }
}

#[test]
fn legacy_binding_path() {
    if !root_or_skip("legacy_binding_path") {
        return;
    }
    let file = TempFile::sparse("legacy", 2 << 20);
    let lo = Loop::bound(attach_with(&file.0, bind_legacy).unwrap());
    assert_eq!(
        backing_file(&lo.0).unwrap().as_deref(),
        Some(file.0.as_path())
    );
    assert_eq!(crate::device::size(&lo.0).unwrap(), 2 << 20);
    let mut info = LoopInfo64::zeroed();
    let dev = File::open(&lo.0).unwrap();
    // SAFETY: dev is open and info is a writable loop_info64.
    unsafe { sys::loop_get_status64(dev.as_raw_fd(), &mut info) }.unwrap();
    assert!(info.lo_file_name.starts_with(file.0.as_os_str().as_bytes()));
}

#[test]
fn long_backing_path_and_losetup_agrees() {
    if !root_or_skip("long_backing_path_and_losetup_agrees") {
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "hosttest-{}-{}",
        std::process::id(),
        "d".repeat(80)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    struct RmDir(PathBuf);
    impl Drop for RmDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _dir = RmDir(dir.clone());
    let file = TempFile(dir.join("backing"));
    std::fs::File::create(&file.0)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let lo = Loop::attach(&file.0);
    // sysfs reports the full path even though lo_file_name is truncated.
    assert_eq!(
        backing_file(&lo.0).unwrap().as_deref(),
        Some(file.0.as_path())
    );
    sh(&format!(
        "losetup --list --noheadings {} | grep -q loop",
        lo.0.display()
    ));
}

#[test]
fn many_concurrent_attaches_get_distinct_devices() {
    if !root_or_skip("many_concurrent_attaches_get_distinct_devices") {
        return;
    }
    let files: Vec<TempFile> = (0..4).map(|_| TempFile::sparse("race", 1 << 20)).collect();
    let loops: Vec<Loop> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .iter()
            .map(|f| s.spawn(|| Loop::attach(&f.0)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut paths: Vec<_> = loops.iter().map(|l| l.0.clone()).collect();
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), 4);
    for (f, l) in files.iter().zip(&loops) {
        assert_eq!(backing_file(&l.0).unwrap().as_deref(), Some(f.0.as_path()));
    }
    drop(loops);
}

#[test]
fn non_loop_paths_are_rejected() {
    assert!(matches!(
        backing_file(Path::new("/dev/null")),
        Err(LoopError::NotLoopDevice { .. })
    ));
    assert!(crate::device::size(Path::new("/dev/null")).is_err());
}
