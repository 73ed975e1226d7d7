//! The bench's work dir, checked before anything is created: the agent refuses staging and
//! target paths outside its allowed prefixes, and a bench that finds out at its first
//! NodeStage has already created and attached every volume.

use std::path::{Component, Path, PathBuf};

use ebs_proto::admin::ConfigRequest;
use ebs_proto::admin::admin_client::AdminClient;
use tonic::transport::Channel;

/// What the agent told us about where paths may lie.
pub struct AgentPaths {
    pub state_dir: PathBuf,
    pub allowed: Vec<PathBuf>,
}

/// Asks the agent over its Admin service. `None` for an endpoint that does not serve it (another
/// driver): only the local checks can run then.
pub async fn ask(channel: Channel) -> Result<Option<AgentPaths>, String> {
    match AdminClient::new(channel).config(ConfigRequest {}).await {
        Ok(r) => {
            let r = r.into_inner();
            Ok(Some(AgentPaths {
                state_dir: r.state_dir.into(),
                allowed: r
                    .allowed_path_prefixes
                    .into_iter()
                    .map(Into::into)
                    .collect(),
            }))
        }
        Err(s) if s.code() == tonic::Code::Unimplemented => Ok(None),
        Err(s) => Err(format!(
            "asking the agent for its settings: {}",
            s.message()
        )),
    }
}

/// `Err` says why the agent would refuse paths below `work_dir`, and what to pass instead.
pub fn check(work_dir: &Path, agent: Option<&AgentPaths>) -> Result<(), String> {
    let shown = work_dir.display();
    if !work_dir.is_absolute()
        || work_dir
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(format!(
            "--work-dir {shown} must be an absolute path without . or .. components"
        ));
    }
    let Some(agent) = agent else {
        return Ok(());
    };
    if work_dir.starts_with(&agent.state_dir) {
        return Err(format!(
            "--work-dir {shown} lies inside the agent's state directory {}, which holds the \
             agent's own files and is no place for mounts: pass a --work-dir below one of the \
             agent's allowed path prefixes ({})",
            agent.state_dir.display(),
            list(&agent.allowed)
        ));
    }
    if !agent.allowed.iter().any(|p| work_dir.starts_with(p)) {
        return Err(format!(
            "--work-dir {shown} is outside the agent's allowed path prefixes ({}), so every \
             NodeStage would be refused: pass a --work-dir below one of them, or start the agent \
             with --allowed-path-prefix {}",
            list(&agent.allowed),
            work_dir.parent().unwrap_or(work_dir).display()
        ));
    }
    Ok(())
}

fn list(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "none".into();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> AgentPaths {
        AgentPaths {
            state_dir: "/var/lib/ebs-node-agent".into(),
            allowed: vec!["/var/lib/kubelet".into(), "/mnt/ebs-node-agent".into()],
        }
    }

    #[test]
    fn a_work_dir_below_an_allowed_prefix_passes() {
        assert!(check(Path::new("/mnt/ebs-node-agent/bench"), Some(&agent())).is_ok());
        // Another driver: only the local checks.
        assert!(check(Path::new("/anywhere/bench"), None).is_ok());
    }

    #[test]
    fn refusals_name_the_prefixes_and_the_way_out() {
        let e = check(Path::new("/srv/bench"), Some(&agent())).unwrap_err();
        assert!(e.contains("/var/lib/kubelet, /mnt/ebs-node-agent"), "{e}");
        assert!(e.contains("--allowed-path-prefix /srv"), "{e}");
        let e = check(Path::new("/var/lib/ebs-node-agent/bench"), Some(&agent())).unwrap_err();
        assert!(e.contains("state directory"), "{e}");
        assert!(check(Path::new("bench"), None).is_err());
        assert!(check(Path::new("/mnt/ebs-node-agent/../srv"), Some(&agent())).is_err());
    }
}
