//! mkfs's command line, apart from the device: what the agent always asks of mkfs, and the
//! caller's validated options merged in.

use ebs_node_core::request::FsType;

/// mkfs's arguments before the device. mkfs never discards (`-E nodiscard`, `-K`): the blank
/// proof looked at what it could, and a discard would destroy whatever else the device holds
/// (on thin storage it also zeroes, and on a large EBS volume it is what makes mkfs slow). ext's
/// extended options go in one `-E` list, the caller's merged in: mke2fs keeps only the last.
/// `legacy_xfs`: `--legacy-xfs`'s options for the installed mkfs.xfs (empty when off).
pub fn mkfs_args(fs: FsType, uuid: &str, legacy_xfs: &[String], extra: Vec<String>) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    if fs.is_ext() {
        args.extend(["-F", "-q", "-m", "0", "-U", uuid].map(String::from));
        let mut extended = vec![
            "lazy_itable_init=1".to_string(),
            "lazy_journal_init=1".to_string(),
            "nodiscard".to_string(),
        ];
        let mut rest = extra.into_iter();
        let mut others = Vec::new();
        while let Some(arg) = rest.next() {
            if arg != "-E" {
                others.push(arg);
                continue;
            }
            let list = rest.next().unwrap_or_default();
            extended.extend(
                list.split(',')
                    .filter(|o| !o.is_empty() && *o != "discard" && *o != "nodiscard")
                    .map(String::from),
            );
        }
        args.extend(["-E".into(), extended.join(",")]);
        args.extend(others);
    } else {
        args.extend(["-f", "-q", "-K", "-m"].map(String::from));
        args.push(format!("uuid={uuid}"));
        args.extend(legacy_xfs.iter().cloned());
        args.extend(extra);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebs_node_core::request::FormatOptions;

    #[test]
    fn mkfs_never_discards_and_passes_one_extended_list() {
        let opts = FormatOptions {
            block_size: Some(4096),
            ..Default::default()
        };
        for fs in [FsType::Ext4, FsType::Ext3] {
            let args = mkfs_args(fs, "u", &[], opts.mkfs_args(fs));
            assert_eq!(args.iter().filter(|a| *a == "-E").count(), 1, "{args:?}");
            let at = args.iter().position(|a| a == "-E").unwrap();
            assert_eq!(
                args[at + 1],
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard"
            );
            assert!(args.ends_with(&["-b".into(), "4096".into()]), "{args:?}");
        }
        let legacy = crate::fstools::legacy_xfs_args(Some((6, 1)));
        for legacy in [&[][..], &legacy[..]] {
            let args = mkfs_args(FsType::Xfs, "u", legacy, opts.mkfs_args(FsType::Xfs));
            assert!(args.contains(&"-K".to_string()), "{args:?}");
            assert!(
                legacy.is_empty() || args.windows(legacy.len()).any(|w| w == legacy),
                "{args:?}"
            );
        }
    }

    #[test]
    fn a_callers_extended_options_join_the_one_list() {
        let extra = [
            "-E",
            "stride=8,discard",
            "-b",
            "1024",
            "-E",
            "stripe_width=16",
        ];
        let args = mkfs_args(
            FsType::Ext4,
            "u",
            &[],
            extra.iter().map(|s| s.to_string()).collect(),
        );
        assert_eq!(args.iter().filter(|a| *a == "-E").count(), 1, "{args:?}");
        assert!(
            args.windows(2).any(|w| w[0] == "-E"
                && w[1]
                    == "lazy_itable_init=1,lazy_journal_init=1,nodiscard,stride=8,stripe_width=16"),
            "{args:?}"
        );
        assert!(args.ends_with(&["-b".into(), "1024".into()]), "{args:?}");
    }
}
