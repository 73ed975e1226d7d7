//! An instance on an Outpost reports it in instance metadata (`outpost-arn`); NodeGetInfo then
//! carries the same four topology segments as the upstream driver's node, so StorageClasses and
//! volumes that name an Outpost keep matching this node.

use std::collections::HashMap;

pub const OUTPOST_ID_KEY: &str = "topology.ebs.csi.aws.com/outpost-id";
pub const REGION_KEY: &str = "topology.ebs.csi.aws.com/region";
pub const PARTITION_KEY: &str = "topology.ebs.csi.aws.com/partition";
pub const ACCOUNT_ID_KEY: &str = "topology.ebs.csi.aws.com/account-id";

/// An `outpost-arn` that is not one, and why.
#[derive(Debug, thiserror::Error)]
#[error("outpost-arn {arn:?} is not an Outpost ARN: {why}")]
pub struct NotAnOutpostArn {
    pub arn: String,
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outpost {
    pub partition: String,
    pub region: String,
    pub account_id: String,
    /// `op-…`: the ARN's resource without its `outpost/` prefix.
    pub outpost_id: String,
}

impl Outpost {
    /// `arn:<partition>:outposts:<region>:<account>:outpost/<id>`. Every part becomes a label
    /// value, so each must be one (at most 63 letters, digits, `-`, `_`, `.`).
    pub fn parse(arn: &str) -> Result<Outpost, NotAnOutpostArn> {
        let bad = |why: &str| NotAnOutpostArn {
            arn: arn.to_string(),
            why: why.to_string(),
        };
        let parts: Vec<&str> = arn.trim().splitn(6, ':').collect();
        let [scheme, partition, service, region, account_id, resource] = parts[..] else {
            return Err(bad("expected six ':'-separated parts"));
        };
        if scheme != "arn" || service != "outposts" {
            return Err(bad("expected arn:<partition>:outposts:…"));
        }
        let outpost_id = resource.strip_prefix("outpost/").unwrap_or(resource);
        for (what, v) in [
            ("partition", partition),
            ("region", region),
            ("account id", account_id),
            ("outpost id", outpost_id),
        ] {
            let label_safe = !v.is_empty()
                && v.len() <= 63
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if !label_safe {
                return Err(bad(&format!("the {what} {v:?} is not a label value")));
            }
        }
        Ok(Outpost {
            partition: partition.into(),
            region: region.into(),
            account_id: account_id.into(),
            outpost_id: outpost_id.into(),
        })
    }

    pub fn add_segments(&self, topology: &mut HashMap<String, String>) {
        for (k, v) in [
            (OUTPOST_ID_KEY, &self.outpost_id),
            (REGION_KEY, &self.region),
            (PARTITION_KEY, &self.partition),
            (ACCOUNT_ID_KEY, &self.account_id),
        ] {
            topology.insert(k.to_string(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_as_upstream_does() {
        let o =
            Outpost::parse("arn:aws:outposts:us-west-2:111122223333:outpost/op-0abcdef123456789")
                .unwrap();
        assert_eq!(o.outpost_id, "op-0abcdef123456789");
        assert_eq!(o.region, "us-west-2");
        assert_eq!(o.partition, "aws");
        assert_eq!(o.account_id, "111122223333");
        let mut t = HashMap::new();
        o.add_segments(&mut t);
        assert_eq!(t[OUTPOST_ID_KEY], "op-0abcdef123456789");
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn refuses_what_is_not_an_outpost_arn() {
        for bad in [
            "",
            "op-123",
            "arn:aws:ec2:us-west-2:111122223333:instance/i-1",
            "arn:aws:outposts:us-west-2:111122223333:outpost/op 1",
            "arn:aws:outposts::111122223333:outpost/op-1",
        ] {
            assert!(Outpost::parse(bad).is_err(), "{bad}");
        }
    }
}
