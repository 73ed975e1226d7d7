pub mod blank;
pub mod blkid;
pub mod command;
pub mod direct_read;
pub mod fstools;
pub mod loopdev;
pub mod mounter;
pub mod mountinfo;
