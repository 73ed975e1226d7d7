//! max_volumes_per_node: how many more EBS volumes the scheduler may put on this node.
//!
//! `--volume-attach-limit` wins. Otherwise the instance type's entry in
//! `agent/data/instance-limits.tsv` (which cites its AWS source) gives the base, from which
//! what already uses slots on the host is subtracted; the result is clamped to at least 1.

use std::sync::OnceLock;

const TABLE: &str = include_str!("../../data/instance-limits.tsv");

/// The budget of instance types the table does not know: the shared Nitro budget, the most
/// conservative published figure for current types (Xen types have 39, dedicated types 32+).
pub const FALLBACK_SHARED_BUDGET: u32 = 28;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitKind {
    /// The type's own EBS limit; interfaces and instance store do not use it.
    Dedicated,
    /// A budget shared with network interfaces and NVMe instance-store disks.
    Shared,
    /// Xen: 39.
    Xen,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableEntry {
    pub kind: LimitKind,
    pub number: u32,
}

struct Table {
    rows: Vec<(String, TableEntry)>,
    /// Lines that did not parse (the unit test asserts there are none).
    bad: Vec<String>,
}

fn table() -> &'static Table {
    static PARSED: OnceLock<Table> = OnceLock::new();
    PARSED.get_or_init(|| {
        let t = parse_table(TABLE);
        for line in &t.bad {
            tracing::warn!(line, "instance-limits.tsv: line ignored");
        }
        t
    })
}

fn parse_table(text: &str) -> Table {
    let mut rows = Vec::new();
    let mut bad = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let kind = match fields.get(1) {
            Some(&"dedicated") => Some(LimitKind::Dedicated),
            Some(&"shared") => Some(LimitKind::Shared),
            Some(&"xen") => Some(LimitKind::Xen),
            _ => None,
        };
        match (fields.as_slice(), kind) {
            ([pattern, _, n], Some(kind)) if n.parse::<u32>().is_ok_and(|n| n > 0) => {
                let number = n.parse().unwrap_or(1);
                rows.push((pattern.to_string(), TableEntry { kind, number }));
            }
            _ => bad.push(line.to_string()),
        }
    }
    Table { rows, bad }
}

/// The exact type's line, else its family's (`m7i.*`).
pub fn lookup(instance_type: &str) -> Option<TableEntry> {
    let rows = &table().rows;
    let exact = rows.iter().find(|(p, _)| p == instance_type);
    let family = || {
        let (fam, _) = instance_type.split_once('.')?;
        let pattern = format!("{fam}.*");
        rows.iter().find(|(p, _)| *p == pattern)
    };
    exact.or_else(family).map(|(_, e)| *e)
}

/// Everything the number depends on, so it can be computed (and tested) without a host.
#[derive(Clone, Debug, Default)]
pub struct LimitInputs {
    pub override_limit: Option<u32>,
    pub reserved: u32,
    pub instance_type: Option<String>,
    /// Attached network interfaces and where the count came from; `None`: assume 1.
    pub network_interfaces: Option<(u32, &'static str)>,
    pub instance_store_disks: u32,
    /// Attached EBS volumes the agent did not stage (root volume, other non-CSI disks).
    pub unmanaged_ebs: u32,
}

/// The limit and a sentence that says how it was reached (logged once at start).
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
    let entry = inputs.instance_type.as_deref().and_then(lookup);
    let (kind, base, what) = match (&inputs.instance_type, entry) {
        (Some(t), Some(e)) => (e.kind, e.number, format!("instance type {t}")),
        (Some(t), None) => (
            LimitKind::Shared,
            FALLBACK_SHARED_BUDGET,
            format!("unknown instance type {t} (fallback)"),
        ),
        (None, _) => (
            LimitKind::Shared,
            FALLBACK_SHARED_BUDGET,
            "unknown instance type (fallback; give --instance-type)".to_string(),
        ),
    };
    let mut limit = i64::from(base);
    let mut how = match kind {
        LimitKind::Dedicated => format!("{what}: dedicated EBS limit {base}"),
        LimitKind::Shared => format!("{what}: shared Nitro budget {base}"),
        LimitKind::Xen => format!("{what}: Xen limit {base}"),
    };
    if kind == LimitKind::Shared {
        let (nics, from) = inputs.network_interfaces.unwrap_or((1, "assumed"));
        limit -= i64::from(nics) + i64::from(inputs.instance_store_disks);
        how += &format!(
            " - {nics} network interface(s) ({from}) - {} instance-store disk(s)",
            inputs.instance_store_disks
        );
    }
    limit -= i64::from(inputs.unmanaged_ebs) + i64::from(inputs.reserved);
    how += &format!(
        " - {} attached volume(s) not staged by the agent - {} reserved",
        inputs.unmanaged_ebs, inputs.reserved
    );
    if limit < 1 {
        how += &format!(" = {limit}, clamped to 1");
        limit = 1;
    } else {
        how += &format!(" = {limit}");
    }
    Derivation { limit, how }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(t: &str) -> LimitInputs {
        LimitInputs {
            instance_type: Some(t.into()),
            network_interfaces: Some((1, "test")),
            unmanaged_ebs: 1,
            ..Default::default()
        }
    }

    #[test]
    fn the_table_parses_cleanly_and_has_no_duplicates() {
        let t = parse_table(TABLE);
        assert!(t.bad.is_empty(), "bad lines: {:?}", t.bad);
        assert!(t.rows.len() > 100);
        let mut seen = std::collections::HashSet::new();
        for (p, _) in &t.rows {
            assert!(seen.insert(p), "duplicate {p}");
        }
    }

    #[test]
    fn override_wins() {
        let d = compute(&LimitInputs {
            override_limit: Some(7),
            reserved: 3,
            ..inputs("m5.large")
        });
        assert_eq!(d.limit, 7);
        assert!(d.how.contains("--volume-attach-limit"));
    }

    #[test]
    fn dedicated_types_ignore_interfaces_and_instance_store() {
        let mut i = inputs("m7i.48xlarge");
        i.network_interfaces = Some((4, "test"));
        i.instance_store_disks = 2;
        assert_eq!(compute(&i).limit, 128 - 1);
        assert_eq!(compute(&inputs("m7i.large")).limit, 32 - 1);
        assert_eq!(compute(&inputs("c8gn.48xlarge")).limit, 64 - 1);
    }

    #[test]
    fn shared_types_subtract_interfaces_and_instance_store() {
        // m5d.24xlarge: 4 instance-store disks; 3 interfaces; root volume.
        let mut i = inputs("m5d.24xlarge");
        i.network_interfaces = Some((3, "test"));
        i.instance_store_disks = 4;
        let d = compute(&i);
        assert_eq!(d.limit, 28 - 3 - 4 - 1);
        assert!(d.how.contains("shared Nitro budget 28"), "{}", d.how);
        // The same formula gives AWS's published figure for an accelerator type.
        let mut g = inputs("g5.48xlarge");
        g.instance_store_disks = 2;
        g.unmanaged_ebs = 0;
        assert_eq!(compute(&g).limit, 9);
        // A family line covers sizes the table does not list.
        assert_eq!(lookup("m6i.metal").map(|e| e.number), Some(32));
        assert_eq!(lookup("m6i.large"), None);
    }

    #[test]
    fn xen_types_have_39() {
        assert_eq!(compute(&inputs("m4.large")).limit, 39 - 1);
        assert_eq!(lookup("i3.large").map(|e| e.kind), Some(LimitKind::Xen));
        assert_eq!(lookup("i3.metal").map(|e| e.kind), Some(LimitKind::Shared));
    }

    #[test]
    fn unknown_types_fall_back_to_the_shared_budget() {
        let d = compute(&inputs("zz9.plural"));
        assert_eq!(d.limit, 28 - 1 - 1);
        assert!(d.how.contains("fallback"), "{}", d.how);
        let d = compute(&LimitInputs {
            instance_type: None,
            ..inputs("")
        });
        assert_eq!(d.limit, 26);
        assert!(d.how.contains("--instance-type"));
    }

    #[test]
    fn clamped_to_one_and_reserved_subtracts() {
        let mut i = inputs("d3.8xlarge");
        i.instance_store_disks = 24;
        i.unmanaged_ebs = 2;
        assert_eq!(compute(&i).limit, 1, "exactly 1 is not clamped");
        assert!(!compute(&i).how.contains("clamped"));
        i.unmanaged_ebs = 4;
        let d = compute(&i);
        assert_eq!(d.limit, 1);
        assert!(d.how.contains("clamped"), "{}", d.how);
        let mut r = inputs("m7i.large");
        r.reserved = 5;
        assert_eq!(compute(&r).limit, 32 - 1 - 5);
    }
}
