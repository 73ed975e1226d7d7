pub mod blank;
pub mod blkid;
pub mod command;
pub mod fstools;
pub mod loopdev;
pub mod malloc;
pub mod mounter;
pub mod mountinfo;
