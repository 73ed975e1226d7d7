//! A filesystem of the requested type, or something else, found on the device.

use super::*;

/// A filesystem of the requested type is on the device.
#[test]
fn a_requested_filesystem_is_used_as_found_or_refused_never_redone_without_licence() {
    let d = || Double::default();
    for r in [
        row(
            "no record: adopted",
            fs_sig("ext4", OTHER),
            None,
            Want::Check {
                uuid: OTHER,
                adopt: true,
            },
        )
        .reads(&["xfs_mkfs_unfinished"]),
        row(
            "done, same UUID: ours",
            fs_sig("ext4", OURS),
            done(OURS),
            Want::Check {
                uuid: OURS,
                adopt: false,
            },
        )
        .reads(&["xfs_mkfs_unfinished"]),
        row(
            "done, another UUID: the wrong device",
            fs_sig("ext4", OTHER),
            done(OURS),
            Want::WrongDevice("formatted with UUID"),
        )
        .reads(&[]),
        row(
            "intent on this attachment, a whole filesystem: mkfs finished, used and recorded",
            fs_sig("ext4", OURS),
            intent(OURS, Some(NOW)),
            Want::Check {
                uuid: OURS,
                adopt: true,
            },
        )
        .reads(&["attachment", "xfs_mkfs_unfinished"]),
        row(
            "intent on this attachment, an xfs whose mkfs never finished: redone with its UUID",
            fs_sig("ext4", OURS),
            intent(OURS, Some(NOW)),
            Want::Format(OURS),
        )
        .device(Double {
            unfinished: true,
            ..d()
        })
        .reads(&[
            "attachment",
            "xfs_mkfs_unfinished",
            "size",
            "prove_blank_past",
        ]),
        row(
            "intent on this attachment, an unfinished xfs with data past its first writes: refused",
            fs_sig("ext4", OURS),
            intent(OURS, Some(NOW)),
            Want::NotBlank("whose mkfs never finished, and written data"),
        )
        .device(Double {
            unfinished: true,
            past_head: Some("written data"),
            ..d()
        })
        .reads(&[
            "attachment",
            "xfs_mkfs_unfinished",
            "size",
            "prove_blank_past",
        ]),
        row(
            "intent on this attachment, read-only: used, not redone",
            fs_sig("ext4", OURS),
            intent(OURS, Some(NOW)),
            Want::Check {
                uuid: OURS,
                adopt: false,
            },
        )
        .readonly()
        .reads(&["attachment", "xfs_mkfs_unfinished"]),
        row(
            "intent on this attachment, another UUID: the wrong device",
            fs_sig("ext4", OTHER),
            intent(OURS, Some(NOW)),
            Want::WrongDevice("formatted with UUID"),
        )
        .reads(&["attachment"]),
        row(
            "intent of an earlier attachment: no licence, adopted as found",
            fs_sig("ext4", OURS),
            intent(OURS, Some(BEFORE)),
            Want::Check {
                uuid: OURS,
                adopt: true,
            },
        )
        .reads(&["attachment", "xfs_mkfs_unfinished"]),
        row(
            "intent without an attachment: no licence",
            fs_sig("ext4", OURS),
            intent(OURS, None),
            Want::Check {
                uuid: OURS,
                adopt: true,
            },
        )
        .reads(&["xfs_mkfs_unfinished"]),
        row(
            "intent, device's attachment unknown: no licence",
            fs_sig("ext4", OURS),
            intent(OURS, Some(NOW)),
            Want::Check {
                uuid: OURS,
                adopt: true,
            },
        )
        .device(Double {
            attachment: None,
            ..d()
        })
        .reads(&["attachment", "xfs_mkfs_unfinished"]),
        row(
            "an unfinished xfs mkfs, no licence: refused",
            fs_sig("ext4", OTHER),
            None,
            Want::NotBlank("whose mkfs never finished"),
        )
        .device(Double {
            unfinished: true,
            ..d()
        })
        .reads(&["xfs_mkfs_unfinished"]),
        row(
            "an unfinished mkfs, done record: refused",
            fs_sig("ext4", OURS),
            done(OURS),
            Want::NotBlank("whose mkfs never finished"),
        )
        .device(Double {
            unfinished: true,
            ..d()
        })
        .reads(&["xfs_mkfs_unfinished"]),
    ] {
        check(r);
    }
}

/// Something other than the requested filesystem is on the device: never formatted over.
#[test]
fn anything_else_found_is_refused_whatever_the_record() {
    let gpt = ProbeOutcome::Found(Signature {
        type_name: "ext4".into(),
        uuid: Some(OURS.into()),
        usage: None,
        label: None,
        is_partition_table: true,
        external_journal: None,
    });
    let luks = ProbeOutcome::Found(Signature {
        type_name: "crypto_LUKS".into(),
        uuid: Some(OTHER.into()),
        usage: Some("crypto".into()),
        label: None,
        is_partition_table: false,
        external_journal: None,
    });
    for r in [
        row(
            "ambivalent probe",
            ProbeOutcome::Ambivalent,
            None,
            Want::NotBlank("ambivalent"),
        ),
        row(
            "ambivalent probe, licensed intent",
            ProbeOutcome::Ambivalent,
            intent(OURS, Some(NOW)),
            Want::NotBlank("ambivalent"),
        )
        .reads(&["attachment"]),
        row(
            "another filesystem",
            fs_sig("xfs", OTHER),
            None,
            Want::NotBlank("not the requested ext4"),
        ),
        row(
            "another filesystem, licensed intent",
            fs_sig("xfs", OURS),
            intent(OURS, Some(NOW)),
            Want::NotBlank("filesystem xfs"),
        )
        .reads(&["attachment"]),
        row(
            "a partition table named like the filesystem",
            gpt,
            None,
            Want::NotBlank("partition table ext4"),
        ),
        row(
            "an encryption header",
            luks,
            done(OURS),
            Want::NotBlank("encryption header crypto_LUKS"),
        ),
    ] {
        check(r);
    }
}

/// An ext4 whose journal lies on another device writes to that device at mount: refused,
/// whatever the record says (a nineteenth fresh review's F2).
#[test]
fn a_filesystem_whose_journal_lies_on_another_device_is_never_mounted() {
    let with_journal = |uuid: &str| match fs_sig("ext4", uuid) {
        ProbeOutcome::Found(mut sig) => {
            sig.external_journal = Some("1b234682-e2af-4a52-82a1-9a44e5c5fece".into());
            ProbeOutcome::Found(sig)
        }
        other => other,
    };
    for r in [
        row(
            "no record",
            with_journal(OTHER),
            None,
            Want::NotBlank("journal lies on another device"),
        ),
        row(
            "ours, done",
            with_journal(OURS),
            done(OURS),
            Want::NotBlank("journal lies on another device"),
        ),
        row(
            "ours, read-only",
            with_journal(OURS),
            done(OURS),
            Want::NotBlank("journal UUID 1b234682"),
        )
        .readonly(),
    ] {
        check(r);
    }
}
