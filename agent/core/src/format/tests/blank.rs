//! libblkid found nothing on the device.

use super::*;

/// libblkid found nothing: formatted only on a blank proof, or over our own interrupted mkfs.
#[test]
fn a_device_blkid_calls_blank_is_formatted_only_when_proven_blank_or_ours() {
    let d = || Double::default();
    let blank = || ProbeOutcome::Blank;
    for r in [
        row(
            "proven blank: formatted with a fresh UUID",
            blank(),
            None,
            Want::Format("fresh"),
        )
        .reads(&["size", "prove_blank", "fresh_uuid"]),
        row(
            "data in the windows: refused",
            blank(),
            None,
            Want::NotBlank("non-zero bytes"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes at 4096")),
            ..d()
        })
        .reads(&["size", "prove_blank"]),
        row(
            "no proof possible: refused",
            blank(),
            None,
            Want::Unprovable,
        )
        .device(Double {
            proof: Err("/dev/double cannot be proven blank"),
            ..d()
        })
        .reads(&["size", "prove_blank"]),
        row("size 0: refused", blank(), None, Want::EmptyDevice)
            .device(Double {
                size: Some(0),
                ..d()
            })
            .reads(&["size"]),
        row(
            "size unreadable: an error",
            blank(),
            None,
            Want::Io("sizing /dev/double"),
        )
        .device(Double { size: None, ..d() })
        .reads(&["size"]),
        row(
            "done record, nothing on the device: the wrong device",
            blank(),
            done(OURS),
            Want::WrongDevice("now carries no filesystem"),
        ),
        row(
            "done record, read-only: still the wrong device",
            blank(),
            done(OURS),
            Want::WrongDevice("now carries no filesystem"),
        )
        .readonly(),
        row(
            "read-only, nothing to mount",
            blank(),
            None,
            Want::NothingToMount,
        )
        .readonly(),
        row(
            "read-only, licensed intent: not formatted",
            blank(),
            intent(OURS, Some(NOW)),
            Want::NothingToMount,
        )
        .readonly()
        .reads(&["attachment"]),
        row(
            "licensed intent, proven blank: formatted with its UUID",
            blank(),
            intent(OURS, Some(NOW)),
            Want::Format(OURS),
        )
        .reads(&["attachment", "size", "prove_blank"]),
        row(
            "stale intent, proven blank: formatted with the intent's UUID",
            blank(),
            intent(OURS, Some(BEFORE)),
            Want::Format(OURS),
        )
        .reads(&["attachment", "size", "prove_blank"]),
        row(
            "licensed intent, our superblock alone: mkfs redone",
            blank(),
            intent(OURS, Some(NOW)),
            Want::Format(OURS),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            found_at: 1024,
            carries: Some(OURS),
            ..d()
        })
        .reads(&[
            "attachment",
            "size",
            "prove_blank",
            "carries_uuid",
            "size",
            "prove_blank_past",
        ]),
        row(
            "licensed intent, our superblock and data past it: refused",
            blank(),
            intent(OURS, Some(NOW)),
            Want::NotBlank("an earlier mkfs of volume vol"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            found_at: 1024,
            carries: Some(OURS),
            past_head: Some("written data"),
            ..d()
        })
        .reads(&[
            "attachment",
            "size",
            "prove_blank",
            "carries_uuid",
            "size",
            "prove_blank_past",
        ]),
        row(
            "licensed intent, our superblock, data found first past mkfs's first writes: refused",
            blank(),
            intent(OURS, Some(NOW)),
            Want::NotBlank("an earlier mkfs of volume vol"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            carries: Some(OURS),
            ..d()
        })
        .reads(&["attachment", "size", "prove_blank"]),
        row(
            "licensed intent, data that is not ours: refused",
            blank(),
            intent(OURS, Some(NOW)),
            Want::NotBlank("an earlier mkfs of volume vol"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            found_at: 1024,
            carries: Some(OTHER),
            ..d()
        })
        .reads(&["attachment", "size", "prove_blank", "carries_uuid"]),
        // The licence is the attachment, not the UUID: a stale intent never asks.
        row(
            "stale intent, our UUID on the device: refused, never asked",
            blank(),
            intent(OURS, Some(BEFORE)),
            Want::NotBlank("non-zero bytes"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            carries: Some(OURS),
            ..d()
        })
        .reads(&["attachment", "size", "prove_blank"]),
        row(
            "intent without attachment, our UUID on the device: refused",
            blank(),
            intent(OURS, None),
            Want::NotBlank("non-zero bytes"),
        )
        .device(Double {
            proof: Ok(Some("non-zero bytes")),
            carries: Some(OURS),
            ..d()
        })
        .reads(&["size", "prove_blank"]),
    ] {
        check(r);
    }
}
