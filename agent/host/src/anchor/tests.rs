use super::*;
use crate::loopdev::test_support::TempDir;

#[test]
fn prepare_creates_parents_and_lookup_does_not() {
    let dir = TempDir::new("anchor-create");
    let target = dir.0.join("a/b/c");
    assert!(Anchored::lookup(&dir.0, &target).unwrap().is_none());
    let a = Anchored::prepare(&dir.0, &target).unwrap();
    assert!(dir.0.join("a/b").is_dir());
    assert!(a.stat().unwrap().is_none());
    a.mkdir().unwrap();
    a.mkdir().unwrap();
    assert_eq!(a.stat().unwrap().unwrap().kind, FileKind::Directory);
    assert_eq!(a.remove().unwrap(), Removed::Removed);
    assert_eq!(a.remove().unwrap(), Removed::Absent);
}

#[test]
fn symlinks_anywhere_below_the_prefix_are_refused() {
    let dir = TempDir::new("anchor-links");
    let decoy = TempDir::new("anchor-decoy");
    std::os::unix::fs::symlink(&decoy.0, dir.0.join("link")).unwrap();
    assert!(Anchored::lookup(&dir.0, &dir.0.join("link/x")).is_err());
    assert!(Anchored::prepare(&dir.0, &dir.0.join("link/x/y")).is_err());
    // The final component as a symlink: its entry is never opened through it.
    let a = Anchored::lookup(&dir.0, &dir.0.join("link"))
        .unwrap()
        .unwrap();
    assert!(a.mkdir().is_err());
    assert!(a.open_entry().is_err());
    assert!(a.create_file().is_err());
    assert_eq!(a.stat().unwrap().unwrap().kind, FileKind::Symlink);
    assert!(
        std::fs::read_dir(&decoy.0).unwrap().next().is_none(),
        "nothing created in the decoy"
    );
}

#[test]
fn files_are_created_exclusively() {
    let dir = TempDir::new("anchor-file");
    let a = Anchored::prepare(&dir.0, &dir.0.join("dev")).unwrap();
    a.create_file().unwrap();
    assert_eq!(
        a.create_file().unwrap_err().kind(),
        io::ErrorKind::AlreadyExists
    );
    assert!(a.open_entry().is_ok());
    assert_eq!(a.remove().unwrap(), Removed::Removed);
}

#[test]
fn paths_not_strictly_below_are_refused() {
    let dir = TempDir::new("anchor-below");
    assert!(Anchored::lookup(&dir.0, &dir.0).is_err());
    assert!(Anchored::lookup(&dir.0, Path::new("/etc/x")).is_err());
}

#[test]
fn the_ancestry_is_what_the_held_directory_lies_in() {
    let dir = TempDir::new("anchor-ancestry");
    let a = Anchored::prepare(&dir.0, &dir.0.join("x/y/z")).unwrap();
    let ancestry = a.ancestry().unwrap();
    assert_eq!(ancestry.prefix, place_of(&dir.0).unwrap());
    assert_eq!(
        ancestry.dirs,
        vec![
            place_of(&dir.0.join("x/y")).unwrap(),
            place_of(&dir.0.join("x")).unwrap()
        ]
    );
    // Renamed since the walk: still the same places, under any name.
    std::fs::rename(dir.0.join("x"), dir.0.join("w")).unwrap();
    assert_eq!(a.ancestry().unwrap(), ancestry);
    // Moved out from below the prefix: refused.
    let out = TempDir::new("anchor-ancestry-out");
    std::fs::rename(dir.0.join("w"), out.0.join("w")).unwrap();
    assert_eq!(
        a.ancestry().unwrap_err().kind(),
        io::ErrorKind::CrossesDevices
    );
}
