//! Unit tests of the lifecycle pipeline (stage, publish, unpublish, unstage) against the
//! recording double of the host (`double`; its devices and backend in `devices`, its paths in
//! `entries`) and an in-memory ledger (`ledger`): which steps run and in what order, what was
//! durable before each change to the host, and every refusal, with the host left untouched. They
//! run as any user in a second. The root tests (the `ebs-tests` crate, `tests/tests/` at the top
//! of the repository) prove the host itself on real devices.

mod adopted;
mod expand;
mod owners;
mod owners_random;
mod paths;
mod publish;
mod read_only;
mod reclaim;
mod recover;
mod replaced;
mod rng;
mod sim;
mod stacked;
mod stage;
mod stats;
mod unpublish;
mod unstage;
mod views;

use crate::double::host::GIB;
use crate::double::*;
use crate::error::Result;
use crate::node::{PublishCommand, StageCommand, UnpublishCommand, UnstageCommand};
use crate::request::{AccessMode, FsType, RequestPath, VolumeId};
