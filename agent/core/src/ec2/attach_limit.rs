//! max_volumes_per_node, computed the way the upstream aws-ebs-csi-driver node computes it, so a
//! node reports the same number after its plugin is swapped for this agent.
//!
//! The table is `agent/core/data/ec2-ebs-attachment-limits.tsv`: the EC2 API's EBS attachment limit
//! and budget kind per instance type, as upstream's generated table records them. Its header names
//! the source and the formula. The copy is kept byte-identical to the file it came from, so
//! refreshing it means replacing it with a newer copy of the same format and running
//! `cargo test -p ebs-tests --test attach_limits` (see docs/migration-from-aws-ebs-csi-driver.md).
//!
//! The formula, as the header gives it:
//! - `--volume-attach-limit N` (N >= 0) is the answer.
//! - Otherwise the table's value L (types it lacks: 27, shared). Upstream no longer answers 10 on
//!   Snow devices (it dropped Snow support), so neither does the agent.
//! - Minus the reserved slots: `--reserved-volume-attachments N` (N >= 0), or else what this host
//!   has attached outside the agent (the root volume and other EBS disks the agent did not stage,
//!   counted live from sysfs; at least 1, the root volume). Upstream's automatic count is the
//!   boot-time block-device mappings + 1; both give 1 on a node with only its root volume.
//! - For `shared` types, minus the network interfaces beyond the first (L already excludes one,
//!   the instance-store disks and the accelerator slots).
//! - At least 1.

use std::collections::HashMap;
use std::sync::OnceLock;

const TABLE: &str = include_str!("../../data/ec2-ebs-attachment-limits.tsv");

/// What upstream assumes for a type its table lacks.
pub const UNKNOWN_TYPE: TableEntry = TableEntry {
    limit: 27,
    budget: Budget::Shared,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// The limit is shared with network interfaces (the table's value already excludes one).
    Shared,
    /// The limit is for EBS alone (7th-generation Nitro types and later, and Xen types).
    Dedicated,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableEntry {
    pub limit: u32,
    pub budget: Budget,
}

struct Table {
    rows: HashMap<String, TableEntry>,
    /// Lines that did not parse: the table is built in, and a unit test asserts there are none
    /// (`the_table_parses_cleanly`), so a refreshed copy that does not parse fails the build's
    /// tests instead of warning on every node.
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "read by the table's unit test only")
    )]
    bad: Vec<String>,
}

fn table() -> &'static Table {
    static PARSED: OnceLock<Table> = OnceLock::new();
    PARSED.get_or_init(|| parse_table(TABLE))
}

fn parse_table(text: &str) -> Table {
    let mut rows = HashMap::new();
    let mut bad = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let budget = match fields.get(2) {
            Some(&"shared") => Some(Budget::Shared),
            Some(&"dedicated") => Some(Budget::Dedicated),
            _ => None,
        };
        let limit = fields.get(1).and_then(|n| n.parse::<u32>().ok());
        match (fields.first(), limit, budget) {
            (Some(t), Some(limit), Some(budget)) if fields.len() == 5 && limit > 0 => {
                if rows
                    .insert(t.to_string(), TableEntry { limit, budget })
                    .is_some()
                {
                    bad.push(format!("duplicate: {line}"));
                }
            }
            _ => bad.push(line.to_string()),
        }
    }
    Table { rows, bad }
}

/// The type's line in the table.
pub fn lookup(instance_type: &str) -> Option<TableEntry> {
    table().rows.get(instance_type).copied()
}

/// Everything the number depends on, so it can be computed (and tested) without a host.
#[derive(Clone, Debug, Default)]
pub struct LimitInputs {
    /// `--volume-attach-limit` when >= 0.
    pub override_limit: Option<u32>,
    /// `--reserved-volume-attachments` when >= 0: replaces the automatic count.
    pub reserved: Option<u32>,
    pub instance_type: Option<String>,
    pub region: Option<String>,
    /// Attached network interfaces and where the count came from; `None`: assume 1.
    pub network_interfaces: Option<(u32, &'static str)>,
    /// Attached EBS volumes the agent did not stage (root volume, other non-CSI disks).
    pub unmanaged_ebs: u32,
}

/// The limit and a sentence that says how it was reached (logged when it changes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derivation {
    pub limit: i64,
    pub how: String,
}

pub fn compute(inputs: &LimitInputs) -> Derivation {
    if let Some(n) = inputs.override_limit {
        return Derivation {
            limit: i64::from(n),
            how: format!("{n} from --volume-attach-limit"),
        };
    }
    let (entry, what) = match inputs.instance_type.as_deref() {
        Some(t) => match lookup(t) {
            Some(e) => (e, format!("instance type {t}")),
            None => (
                UNKNOWN_TYPE,
                format!("instance type {t} (not in the table)"),
            ),
        },
        None => (
            UNKNOWN_TYPE,
            "unknown instance type (give --instance-type)".to_string(),
        ),
    };
    let kind = match entry.budget {
        Budget::Shared => "shared",
        Budget::Dedicated => "dedicated",
    };
    let mut limit = i64::from(entry.limit);
    let mut how = format!("{what}: {kind} limit {}", entry.limit);
    match inputs.reserved {
        Some(r) => {
            limit -= i64::from(r);
            how += &format!(" - {r} from --reserved-volume-attachments");
        }
        None => {
            let r = inputs.unmanaged_ebs.max(1);
            limit -= i64::from(r);
            how += &format!(
                " - {r} attached volume(s) not staged by the agent (root included, at least 1)"
            );
        }
    }
    if entry.budget == Budget::Shared {
        let (nics, from) = inputs.network_interfaces.unwrap_or((1, "assumed"));
        let extra = nics.saturating_sub(1);
        limit -= i64::from(extra);
        how += &format!(" - {extra} network interface(s) beyond the first ({nics}, {from})");
    }
    if limit < 1 {
        how += &format!(" = {limit}, raised to 1");
        limit = 1;
    } else {
        how += &format!(" = {limit}");
    }
    Derivation { limit, how }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_only(t: &str, nics: u32) -> i64 {
        compute(&LimitInputs {
            instance_type: Some(t.into()),
            network_interfaces: Some((nics, "test")),
            unmanaged_ebs: 1,
            ..Default::default()
        })
        .limit
    }

    #[test]
    fn the_table_parses_cleanly() {
        let t = parse_table(TABLE);
        assert!(t.bad.is_empty(), "bad lines: {:?}", t.bad);
        assert_eq!(t.rows.len(), 1102);
    }

    #[test]
    fn values_the_issue_names() {
        // Several EBS cards: the table's value already counts them.
        assert_eq!(root_only("c8gn.48xlarge", 1), 127);
        // Families newer than the old table.
        assert_eq!(root_only("m8i.large", 3), 31);
        // Xen: 39, dedicated; old families absent from the table: 27 shared.
        assert_eq!(root_only("m4.large", 3), 38);
        for t in ["f1.2xlarge", "g3.4xlarge", "p2.xlarge", "p3.2xlarge"] {
            assert_eq!(root_only(t, 1), 26, "{t}");
        }
        // Shared: instance store already excluded by the table; extra interfaces subtract.
        assert_eq!(root_only("m5d.4xlarge", 1), 25 - 1);
        assert_eq!(root_only("m5d.4xlarge", 3), 25 - 1 - 2);
    }

    #[test]
    fn override_wins_and_reserved_replaces_the_automatic_count() {
        let base = LimitInputs {
            instance_type: Some("m7i.large".into()),
            unmanaged_ebs: 4,
            ..Default::default()
        };
        assert_eq!(compute(&base).limit, 32 - 4);
        let reserved = LimitInputs {
            reserved: Some(2),
            ..base.clone()
        };
        assert_eq!(compute(&reserved).limit, 32 - 2);
        let zero = LimitInputs {
            reserved: Some(0),
            ..base.clone()
        };
        assert_eq!(compute(&zero).limit, 32);
        let forced = LimitInputs {
            override_limit: Some(7),
            reserved: Some(3),
            ..base
        };
        let d = compute(&forced);
        assert_eq!(d.limit, 7);
        assert!(d.how.contains("--volume-attach-limit"), "{}", d.how);
    }

    #[test]
    fn unknown_types_snow_and_the_floor() {
        let d = compute(&LimitInputs::default());
        assert_eq!(d.limit, 26, "27 shared - root");
        assert!(d.how.contains("--instance-type"), "{}", d.how);
        let snow = LimitInputs {
            region: Some("snow".into()),
            instance_type: Some("sbe-c.large".into()),
            ..Default::default()
        };
        // Snow is no longer special upstream: a type the table lacks, as anywhere.
        assert_eq!(compute(&snow).limit, 26);
        let crowded = LimitInputs {
            instance_type: Some("d3.8xlarge".into()),
            unmanaged_ebs: 9,
            ..Default::default()
        };
        let d = compute(&crowded);
        assert_eq!(d.limit, 1);
        assert!(d.how.contains("raised to 1"), "{}", d.how);
    }
}
