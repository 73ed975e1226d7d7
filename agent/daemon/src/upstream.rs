//! The link to a remote controller. With `--backend ebs` the agent holds no cloud credentials: its
//! Controller service forwards every call to `--controller-upstream` (for example the upstream EBS
//! controller), over a unix socket or over TLS, as the CSI spec asks of a plugin whose controller
//! lives elsewhere. Nothing here does I/O at start-up beyond reading the certificate files: the
//! channel connects on the first call and reconnects by itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};

use crate::settings::{BackendKind, Mode};

#[derive(clap::Args, Debug, Clone)]
pub struct UpstreamArgs {
    /// Where Controller calls go (--backend ebs): unix:///path.sock or https://host:port
    /// (http:// only with --upstream-insecure).
    #[arg(long, env = "EBS_AGENT_CONTROLLER_UPSTREAM")]
    pub controller_upstream: Option<String>,
    /// PEM bundle of the CA(s) that sign the upstream's certificate; without it, the system roots.
    #[arg(long, env = "EBS_AGENT_UPSTREAM_CA", requires = "controller_upstream")]
    pub upstream_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with --upstream-key).
    #[arg(long, env = "EBS_AGENT_UPSTREAM_CERT", requires = "upstream_key")]
    pub upstream_cert: Option<PathBuf>,
    /// PEM private key of --upstream-cert.
    #[arg(long, env = "EBS_AGENT_UPSTREAM_KEY", requires = "upstream_cert")]
    pub upstream_key: Option<PathBuf>,
    /// Allow a plain-text http:// upstream (test rigs only: calls carry volume secrets).
    #[arg(
        long,
        env = "EBS_AGENT_UPSTREAM_INSECURE",
        requires = "controller_upstream"
    )]
    pub upstream_insecure: bool,
    /// How long one attempt to reach the upstream may take.
    #[arg(long, env = "EBS_AGENT_UPSTREAM_CONNECT_TIMEOUT", default_value = "5s",
          value_parser = ebs_node_core::config::parse_duration)]
    pub upstream_connect_timeout: Duration,
}

/// Where the upstream is and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Unix(PathBuf),
    Tls(Uri),
    Plain(Uri),
}

impl Target {
    pub fn parse(raw: &str, insecure: bool) -> Result<Target, String> {
        let hint = "use unix:///absolute/path.sock or https://host:port";
        if raw.starts_with("unix:") {
            let path = ebs_node_core::config::unix_socket_path(raw)
                .map(PathBuf::from)
                .ok_or_else(|| format!("controller upstream {raw:?}: {hint}"))?;
            if insecure {
                return Err("--upstream-insecure applies only to an http:// upstream".into());
            }
            return Ok(Target::Unix(path));
        }
        let uri: Uri = raw
            .parse()
            .map_err(|e| format!("controller upstream {raw:?} is not a URL ({e}): {hint}"))?;
        if uri.host().is_none() || uri.path() != "/" || uri.query().is_some() {
            return Err(format!(
                "controller upstream {raw:?}: give scheme, host and port only; {hint}"
            ));
        }
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(format!(
                "controller upstream {raw:?}: credentials in the URL are not supported; use \
                 --upstream-cert/--upstream-key"
            ));
        }
        match uri.scheme_str() {
            Some("https") if insecure => {
                Err("--upstream-insecure applies only to an http:// upstream".into())
            }
            Some("https") => Ok(Target::Tls(uri)),
            Some("http") if insecure => Ok(Target::Plain(uri)),
            Some("http") => Err(format!(
                "controller upstream {raw:?} is plain text, and Controller calls carry volume \
                 secrets: use https:// (or a unix socket), or pass --upstream-insecure for a test rig"
            )),
            _ => Err(format!("controller upstream {raw:?}: {hint}")),
        }
    }
}

/// A lazily connected channel to the upstream controller.
#[derive(Clone)]
pub struct Upstream {
    /// The URL as given, for messages.
    pub url: String,
    pub channel: Channel,
}

fn read_pem(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!("{what} {} holds no PEM block", path.display()));
    }
    Ok(pem)
}

fn tls_config(args: &UpstreamArgs) -> Result<ClientTlsConfig, String> {
    let mut tls = ClientTlsConfig::new();
    tls = match &args.upstream_ca {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(read_pem("--upstream-ca", ca)?)),
        None => tls.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&args.upstream_cert, &args.upstream_key) {
        tls = tls.identity(Identity::from_pem(
            read_pem("--upstream-cert", cert)?,
            read_pem("--upstream-key", key)?,
        ));
    }
    Ok(tls)
}

impl Upstream {
    /// Builds the channel; it connects on the first call. Certificate files are read and parsed
    /// now, so a bad path or file stops the agent at start.
    pub fn new(url: &str, args: &UpstreamArgs) -> Result<Upstream, String> {
        let target = Target::parse(url, args.upstream_insecure)?;
        let tls_files = args.upstream_ca.is_some() || args.upstream_cert.is_some();
        if tls_files && !matches!(target, Target::Tls(_)) {
            return Err(
                "--upstream-ca, --upstream-cert and --upstream-key apply only to an https:// upstream"
                    .into(),
            );
        }
        let base = match &target {
            // The authority is a placeholder: the connector decides where bytes go.
            Target::Unix(_) => Endpoint::from_static("http://localhost"),
            Target::Tls(uri) | Target::Plain(uri) => Endpoint::from(uri.clone()),
        };
        let endpoint = base
            .user_agent(concat!("ebs-node-agent/", env!("CARGO_PKG_VERSION")))
            .map_err(|e| e.to_string())?
            .connect_timeout(args.upstream_connect_timeout)
            .tcp_nodelay(true)
            .tcp_keepalive(Some(Duration::from_secs(60)))
            // HTTP/2 pings find a dead upstream on an idle link before a call has to.
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        let channel = match target {
            Target::Unix(path) => {
                endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(TokioIo::new(stream))
                    }
                }))
            }
            Target::Tls(_) => endpoint
                .tls_config(tls_config(args)?)
                .map_err(|e| format!("TLS setup for controller upstream {url}: {e}"))?
                .connect_lazy(),
            Target::Plain(_) => {
                tracing::warn!(
                    upstream = url,
                    "controller upstream is plain-text http (--upstream-insecure): volume \
                     secrets cross the network unencrypted; use this for test rigs only"
                );
                endpoint.connect_lazy()
            }
        };
        Ok(Upstream {
            url: url.to_string(),
            channel,
        })
    }
}

/// Which upstream the Controller service forwards to, if any, for these arguments: the ebs backend
/// serving controller calls needs one, the loop backend refuses one, node mode needs none.
pub fn from_args(
    up: &UpstreamArgs,
    backend: BackendKind,
    mode: Mode,
) -> Result<Option<Upstream>, String> {
    match (backend, up.controller_upstream.as_deref()) {
        (BackendKind::Loop, Some(_)) => Err(
            "--controller-upstream is for --backend ebs: the loop backend serves its own \
             controller"
                .into(),
        ),
        (BackendKind::Loop, None) => Ok(None),
        (BackendKind::Ebs, url) if !mode.serves_controller() => {
            if let Some(url) = url {
                tracing::warn!(
                    upstream = url,
                    "--controller-upstream is ignored in --mode node: no Controller service"
                );
            }
            Ok(None)
        }
        (BackendKind::Ebs, None) => Err(format!(
            "--backend ebs with --mode {} forwards Controller calls to a remote controller and \
             holds no cloud credentials itself: give --controller-upstream unix:///path.sock or \
             https://host:port, or run with --mode node",
            mode.name()
        )),
        (BackendKind::Ebs, Some(url)) => Upstream::new(url, up).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        assert_eq!(
            Target::parse("unix:///run/c.sock", false),
            Ok(Target::Unix("/run/c.sock".into()))
        );
        assert!(Target::parse("unix://rel.sock", false).is_err());
        assert!(matches!(
            Target::parse("https://ctl.example:9443", false),
            Ok(Target::Tls(_))
        ));
        let plain = Target::parse("http://127.0.0.1:9000", false).unwrap_err();
        assert!(plain.contains("--upstream-insecure"), "{plain}");
        assert!(matches!(
            Target::parse("http://127.0.0.1:9000", true),
            Ok(Target::Plain(_))
        ));
        assert!(Target::parse("https://h:1", true).is_err());
        assert!(Target::parse("unix:///s.sock", true).is_err());
        assert!(Target::parse("https://h:1/path", false).is_err());
        assert!(Target::parse("https://user:pw@h:1", false).is_err());
        assert!(Target::parse("ftp://h:1", false).is_err());
        assert!(Target::parse("h:1", false).is_err());
    }
}
