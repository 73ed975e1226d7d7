//! Where the `ebs` backend's node identity comes from, in order: flags (or their env vars), the
//! DMI asset tag, instance metadata. Each field takes the first source that has it. The lookup
//! runs in the background and repeats with backoff until the instance id and zone are known;
//! until then NodeGetInfo and Probe answer FAILED_PRECONDITION with a hint naming the flag to
//! set. Nothing here runs on the request path: NodeGetInfo reads what was stored.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::health::{Health, IdentityState};
use ebs_node_backends::nodeinfo::imds::ImdsClient;
use ebs_node_backends::nodeinfo::live_limit::{LiveLimit, StagedSerials};
use ebs_node_backends::nodeinfo::outpost::Outpost;
use ebs_node_backends::nodeinfo::{NodeInfo, NodeInfoSource, dmi};
use ebs_node_core::ec2::attach_limit::LimitInputs;

/// The EBS driver's topology keys, so existing StorageClasses and PersistentVolumes keep working.
pub const ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";
pub const WELL_KNOWN_ZONE_KEY: &str = "topology.kubernetes.io/zone";
/// Reported by the upstream node too (Go's runtime.GOOS).
pub const OS_KEY: &str = "kubernetes.io/os";

pub const LOOKING_UP: &str =
    "the node identity is being looked up (flags, DMI, instance metadata); retry shortly";

const FLAGS: &str = "flags";
const DMI: &str = "DMI board_asset_tag";
const DMI_PRODUCT: &str = "DMI product_name";
const IMDS: &str = "instance metadata";

#[derive(Clone, Debug, Default)]
pub struct SourceConfig {
    pub node_id: Option<String>,
    pub zone: Option<String>,
    pub region: Option<String>,
    pub instance_type: Option<String>,
    pub sysfs_root: PathBuf,
    /// `None`: never call instance metadata (`--imds-disabled`).
    pub imds: Option<ImdsClient>,
    /// `--volume-attach-limit` when >= 0.
    pub attach_limit: Option<u32>,
    /// `--reserved-volume-attachments` when >= 0.
    pub reserved_attachments: Option<u32>,
    /// Volumes the agent has staged: not reserved, the scheduler counts them.
    pub staged: StagedSerials,
    /// The CSI driver name: kubelet's paths for it prove a disk is a CSI volume.
    pub driver_name: String,
    /// The longest pause between two lookups while the identity is missing.
    pub retry_max: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub value: String,
    pub source: &'static str,
}

/// What the sources said so far, field by field.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    pub instance_id: Option<Found>,
    pub zone: Option<Found>,
    pub region: Option<Found>,
    pub instance_type: Option<Found>,
    /// From instance metadata at start; sysfs is asked again at every NodeGetInfo.
    pub imds_interfaces: Option<u32>,
    pub outpost: Option<Outpost>,
}

fn fill(slot: &mut Option<Found>, value: Option<&str>, source: &'static str) {
    if slot.is_none()
        && let Some(v) = value.map(str::trim).filter(|v| !v.is_empty())
    {
        *slot = Some(Found {
            value: v.to_string(),
            source,
        });
    }
}

/// One pass over the sources; keeps what earlier passes found.
pub struct Resolver {
    cfg: SourceConfig,
    pub found: Identity,
    /// Messages already logged, so a retry loop does not repeat them.
    logged: HashSet<String>,
    dmi_note: Option<String>,
    imds_note: Option<String>,
    /// Instance metadata was asked (so whether this is an Outpost is settled, one way or other).
    imds_asked: bool,
}

impl Resolver {
    pub fn new(cfg: SourceConfig) -> Self {
        let mut found = Identity::default();
        fill(&mut found.instance_id, cfg.node_id.as_deref(), FLAGS);
        fill(&mut found.zone, cfg.zone.as_deref(), FLAGS);
        fill(&mut found.region, cfg.region.as_deref(), FLAGS);
        fill(
            &mut found.instance_type,
            cfg.instance_type.as_deref(),
            FLAGS,
        );
        Resolver {
            cfg,
            found,
            logged: HashSet::new(),
            dmi_note: None,
            imds_note: None,
            imds_asked: false,
        }
    }

    fn log_once(&mut self, warn: bool, message: String) {
        if self.logged.insert(message.clone()) {
            if warn {
                tracing::warn!("{message}");
            } else {
                tracing::info!("{message}");
            }
        }
    }

    /// `Ok` once the instance id and zone are known; `Err` is the hint for the operator.
    pub async fn round(&mut self) -> Result<NodeInfo, String> {
        if self.found.instance_id.is_none() {
            let root = self.cfg.sysfs_root.clone();
            match tokio::task::spawn_blocking(move || dmi::instance_id(&root)).await {
                Ok(Ok(Some(id))) => {
                    fill(&mut self.found.instance_id, Some(&id), DMI);
                    self.dmi_note = None;
                }
                Ok(Ok(None)) => {
                    self.dmi_note = Some("the asset tag holds no instance id".into());
                }
                Ok(Err(why)) => self.dmi_note = Some(why.to_string()),
                Err(e) => self.dmi_note = Some(format!("read failed: {e}")),
            }
            if let Some(note) = self.dmi_note.clone() {
                self.log_once(
                    false,
                    format!("node identity: DMI has no instance id: {note}"),
                );
            }
        }
        if self.found.instance_type.is_none() {
            let root = self.cfg.sysfs_root.clone();
            if let Ok(t) = tokio::task::spawn_blocking(move || dmi::instance_type(&root)).await {
                fill(&mut self.found.instance_type, t.as_deref(), DMI_PRODUCT);
            }
        }
        let f = &self.found;
        let want_imds = f.instance_id.is_none() || f.zone.is_none() || f.instance_type.is_none();
        if want_imds && let Some(client) = self.cfg.imds.clone() {
            match client.identity().await {
                Ok(md) => {
                    let f = &mut self.found;
                    fill(&mut f.instance_id, Some(&md.instance_id), IMDS);
                    fill(&mut f.zone, md.zone.as_deref(), IMDS);
                    fill(&mut f.region, md.region.as_deref(), IMDS);
                    fill(&mut f.instance_type, md.instance_type.as_deref(), IMDS);
                    f.imds_interfaces = md.network_interfaces;
                    self.take_outpost(md.outpost_arn.as_deref());
                    self.imds_note = None;
                }
                Err(e) => {
                    self.imds_note = Some(e.to_string());
                    self.log_once(true, format!("node identity: {e}"));
                }
            }
        } else if want_imds {
            self.imds_note = Some("instance metadata: disabled by --imds-disabled".into());
        } else if !self.imds_asked
            && let Some(client) = self.cfg.imds.clone()
        {
            // Flags and DMI gave the identity, but only instance metadata knows whether this
            // node is on an Outpost (whose topology segments a volume may require). Asked once;
            // an answer that does not come does not hold the identity back.
            match client.outpost_arn().await {
                Ok(arn) => self.take_outpost(arn.as_deref()),
                Err(e) => self.log_once(
                    true,
                    format!(
                        "node identity: cannot tell whether this node is on an Outpost (no \
                         Outpost topology segments): {e}; --imds-disabled skips the question"
                    ),
                ),
            }
        }
        self.imds_asked |= self.cfg.imds.is_some();
        if self.found.region.is_none()
            && let Some(region) = self.found.zone.as_ref().and_then(|z| region_of(&z.value))
        {
            self.found.region = Some(Found {
                value: region,
                source: "derived from the zone",
            });
        }
        match (self.found.instance_id.clone(), self.found.zone.clone()) {
            (Some(id), Some(zone)) => Ok(self.node_info(id, zone).await),
            _ => Err(self.hint()),
        }
    }

    fn take_outpost(&mut self, arn: Option<&str>) {
        match arn.map(Outpost::parse) {
            Some(Ok(o)) => self.found.outpost = Some(o),
            Some(Err(why)) => self.log_once(true, format!("node identity: {why}")),
            None => {}
        }
    }

    fn hint(&self) -> String {
        let mut missing = Vec::new();
        if self.found.instance_id.is_none() {
            missing.push("the instance id is unknown: set --node-id (env EBS_AGENT_NODE_ID)");
        }
        if self.found.zone.is_none() {
            missing.push("the availability zone is unknown: set --zone (env EBS_AGENT_ZONE)");
        }
        let mut tried = Vec::new();
        if let Some(n) = &self.dmi_note {
            tried.push(format!("DMI: {n}"));
        }
        if let Some(n) = &self.imds_note {
            tried.push(n.clone());
        }
        format!(
            "node identity incomplete: {}; tried {}; retrying in the background",
            missing.join("; "),
            if tried.is_empty() {
                "flags only".to_string()
            } else {
                tried.join("; ")
            }
        )
    }

    /// The attach limit's inputs as far as they are known; the rest is counted per call.
    pub fn live_limit(&self) -> LiveLimit {
        LiveLimit::new(
            LimitInputs {
                override_limit: self.cfg.attach_limit,
                reserved: self.cfg.reserved_attachments,
                instance_type: self.found.instance_type.as_ref().map(|t| t.value.clone()),
                region: self.found.region.as_ref().map(|r| r.value.clone()),
                ..Default::default()
            },
            self.found.imds_interfaces,
            self.cfg.sysfs_root.clone(),
            self.cfg.staged.clone(),
            self.cfg.driver_name.clone(),
        )
    }

    async fn node_info(&mut self, id: Found, zone: Found) -> NodeInfo {
        let live = self.live_limit();
        let max_volumes = tokio::task::spawn_blocking(move || live.current())
            .await
            .unwrap_or(1);
        let show = |f: &Option<Found>| {
            f.as_ref().map_or("unknown".to_string(), |f| {
                format!("{} (from {})", f.value, f.source)
            })
        };
        tracing::info!(
            instance_id = %show(&Some(id.clone())),
            zone = %show(&Some(zone.clone())),
            region = %show(&self.found.region),
            instance_type = %show(&self.found.instance_type),
            outpost = ?self.found.outpost.as_ref().map(|o| &o.outpost_id),
            "node identity known"
        );
        let mut topology = HashMap::from([
            (ZONE_KEY.to_string(), zone.value.clone()),
            (WELL_KNOWN_ZONE_KEY.to_string(), zone.value),
            (OS_KEY.to_string(), "linux".to_string()),
        ]);
        if let Some(o) = &self.found.outpost {
            o.add_segments(&mut topology);
        }
        NodeInfo {
            node_id: id.value,
            max_volumes,
            topology,
        }
    }
}

/// The lookup's settings from `serve`'s flags. `Err` is a start-up refusal (bad flag values).
pub fn config_from_args(
    args: &crate::cli::ServeArgs,
    store: &Arc<ebs_store::Store>,
) -> Result<SourceConfig, String> {
    if let Some(id) = &args.node_id
        && (id.is_empty() || id.len() > 256)
    {
        return Err("--node-id must be 1 to 256 bytes".into());
    }
    let imds = if args.imds_disabled {
        None
    } else {
        Some(ImdsClient::new(&args.imds_endpoint, args.imds_timeout).map_err(|e| e.to_string())?)
    };
    Ok(SourceConfig {
        node_id: args.node_id.clone(),
        zone: args.zone.clone(),
        region: args.region.clone(),
        instance_type: args.instance_type.clone(),
        sysfs_root: args.sysfs_root.clone(),
        imds,
        attach_limit: args.attach_limit_override(),
        reserved_attachments: args.reserved_override(),
        // Volumes the agent staged use slots the scheduler counts; every other attached EBS
        // disk (the root volume, disks attached by hand or by other tools) is reserved.
        staged: StagedSerials::from_store(Arc::clone(store)),
        driver_name: args.driver_name.clone(),
        retry_max: args.identity_retry_max,
    })
}

/// `us-east-1a` → `us-east-1`, `us-gov-west-1a` → `us-gov-west-1`, `us-west-2-lax-1a` →
/// `us-west-2` (local zones): the parts up to the first one that starts with a digit.
pub fn region_of(zone: &str) -> Option<String> {
    let parts: Vec<&str> = zone.split('-').collect();
    let at = parts
        .iter()
        .position(|p| p.starts_with(|c: char| c.is_ascii_digit()))?;
    let number: String = parts[at]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    (at >= 2).then(|| format!("{}-{number}", parts[..at].join("-")))
}

/// Runs the lookup in the background until the identity is known, keeping `info` and `health`
/// up to date. The first failure is logged; later rounds log only what changed.
pub fn spawn(
    cfg: SourceConfig,
    info: Arc<NodeInfoSource>,
    health: Arc<Health>,
) -> tokio::task::JoinHandle<()> {
    health.set_identity(IdentityState::LookingUp);
    let retry_max = cfg.retry_max.max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut resolver = Resolver::new(cfg);
        let mut delay = retry_max.min(Duration::from_secs(1));
        loop {
            match resolver.round().await {
                Ok(node) => {
                    info.set_live(node, Arc::new(resolver.live_limit()));
                    health.set_identity(IdentityState::Known);
                    return;
                }
                Err(hint) => {
                    resolver.log_once(true, hint.clone());
                    info.set_missing(hint.clone());
                    health.set_identity(IdentityState::Missing(hint));
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(retry_max);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_from_zones() {
        assert_eq!(region_of("us-east-1a").as_deref(), Some("us-east-1"));
        assert_eq!(
            region_of("us-gov-west-1b").as_deref(),
            Some("us-gov-west-1")
        );
        assert_eq!(region_of("us-west-2-lax-1a").as_deref(), Some("us-west-2"));
        assert_eq!(
            region_of("ap-southeast-2c").as_deref(),
            Some("ap-southeast-2")
        );
        assert_eq!(region_of("nowhere"), None);
    }

    #[tokio::test]
    async fn flags_alone_are_enough_and_no_source_gives_a_hint() {
        let cfg = SourceConfig {
            node_id: Some("i-0123456789abcdef0".into()),
            zone: Some("eu-west-1b".into()),
            instance_type: Some("m7i.large".into()),
            sysfs_root: PathBuf::from("/nonexistent-sysfs"),
            ..Default::default()
        };
        let info = Resolver::new(cfg.clone()).round().await.unwrap();
        assert_eq!(info.node_id, "i-0123456789abcdef0");
        assert_eq!(info.topology[ZONE_KEY], "eu-west-1b");
        assert_eq!(info.topology[WELL_KNOWN_ZONE_KEY], "eu-west-1b");
        assert_eq!(info.topology[OS_KEY], "linux");
        // Dedicated 32 - the root volume (at least 1, even where sysfs shows none).
        assert_eq!(info.max_volumes, 31);

        let mut r = Resolver::new(SourceConfig {
            node_id: None,
            zone: None,
            ..cfg
        });
        let hint = r.round().await.unwrap_err();
        assert!(hint.contains("--node-id"), "{hint}");
        assert!(hint.contains("--zone"), "{hint}");
        assert!(hint.contains("--imds-disabled"), "{hint}");
    }
}
