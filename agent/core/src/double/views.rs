//! The double's other views of a device's bytes: devices laid over one another, read-only
//! overlays, and the holds a stage takes on them.

use std::fs::File;
use std::io;

use super::host::{DoubleHost, State};
use crate::DevNum;
use crate::error::{Error, Result};
use crate::node::host::{HeldViews, ReadOnlyDevice, View};
use crate::node::volume_device::VolumeDevice;
use crate::seam::FileKind as FileType;

impl DoubleHost {
    pub(super) fn views_of_bytes(&self, devnum: DevNum) -> io::Result<Vec<View>> {
        let s = self.state();
        let bottom = s.bottom(devnum);
        let mut views: Vec<DevNum> = (s.devices.values().copied())
            .filter(|d| *d != devnum && s.bottom(*d) == bottom)
            .collect();
        views.extend(
            (s.read_only.iter())
                .filter(|(_, under)| s.bottom(*under) == bottom)
                .map(|(ro, _)| *ro),
        );
        views.sort();
        views.dedup();
        Ok(views
            .into_iter()
            .map(|d| {
                let mounted = s.mounts.values().flatten().any(|m| {
                    m.dev == d || (m.node.kind == FileType::BlockDevice && m.node.rdev == d)
                });
                let over = s.read_only.iter().find(|(ro, _)| *ro == d).map(|(_, u)| *u);
                View {
                    devnum: d,
                    name: s.ro_tags.get(&d).cloned().unwrap_or_default(),
                    read_only: over.is_some(),
                    lies_over: over,
                    in_use: (mounted || s.claimed.contains(&d) || s.view_holds.contains_key(&d))
                        .then(|| "mounted or claimed exclusively".to_string()),
                    told: true,
                }
            })
            .collect())
    }

    /// Each view claimed as O_EXCL claims it: refused while mounted or claimed, and claimed
    /// (`still_claimed`, in use to `views_of`, a mount of it refused) until the hold drops.
    pub(super) fn hold_views_of(&self, views: &[DevNum]) -> io::Result<HeldViews> {
        let mut s = self.state();
        if views
            .iter()
            .any(|v| s.claimed.contains(v) || s.view_holds.contains_key(v))
        {
            return Err(io::Error::from_raw_os_error(super::devices::EBUSY));
        }
        for v in views {
            *s.view_holds.entry(*v).or_default() += 1;
        }
        drop(s);
        let host = self.me.upgrade().expect("the double outlives its calls");
        Ok(HeldViews {
            claims: vec![Box::new(super::devices::ViewHold {
                host,
                devnums: views.to_vec(),
            })],
            devnums: views.to_vec(),
        })
    }

    pub(super) fn lay_read_only_over(
        &self,
        device: &VolumeDevice,
        tag: &str,
    ) -> Result<ReadOnlyDevice> {
        self.act(
            format!("lay read-only over {}", Self::name(device.path())),
            "lay",
        )
        .map_err(|e| Error::LoopDevice {
            op: "laying a read-only loop device".into(),
            source: Box::new(e),
        })?;
        let n = self.state().read_only.len();
        let path = self.add_device(&format!("ro-{n}"), 0);
        let ro = self.devnum(&path);
        let mut s = self.state();
        s.read_only.push((ro, device.devnum()));
        s.ro_tags.insert(ro, tag.to_string());
        drop(s);
        let file = File::open(&path).map_err(|e| Error::io("opening", e))?;
        Ok(ReadOnlyDevice { file, path })
    }

    pub(super) fn remove_read_only_tagged(&self, tag: &str) -> Result<usize> {
        self.act("remove read-only".into(), "remove_ro")
            .map_err(|e| Error::LoopDevice {
                op: "removing read-only loop devices".into(),
                source: Box::new(e),
            })?;
        let mut s = self.state();
        let State {
            read_only, ro_tags, ..
        } = &mut *s;
        let before = read_only.len();
        read_only.retain(|(ro, _)| ro_tags.get(ro).is_some_and(|t| t != tag));
        Ok(before - read_only.len())
    }
}
