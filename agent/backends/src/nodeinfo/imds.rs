//! An IMDSv2 client: PUT a session token, then GET the few metadata paths the agent needs.
//!
//! A tiny HTTP/1.1 client over a tokio `TcpStream` rather than hyper or reqwest: instance
//! metadata is plain HTTP on a link-local address, every request is one line of headers and
//! every answer a few bytes, so a full client (TLS, pools, redirects) would add build time and
//! nothing the agent uses. Each request has its own timeout and `Connection: close`.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use ebs_node_core::ec2::imds::{MAX_RESPONSE, NotHttp, Response, parse_response};

pub const DEFAULT_ENDPOINT: &str = "http://169.254.169.254";
const TOKEN_TTL_SECONDS: u32 = 21600;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImdsError {
    #[error("instance metadata at {endpoint} is unreachable: {why}")]
    Unreachable { endpoint: String, why: String },
    #[error(
        "the instance metadata token request to {endpoint} got no answer within {timeout:?}: from \
         a container this is usually the instance's metadata hop limit of 1 (raise it to 2 with \
         `aws ec2 modify-instance-metadata-options --http-put-response-hop-limit 2`), or give the \
         identity by hand with --node-id and --zone"
    )]
    TokenTimeout { endpoint: String, timeout: Duration },
    #[error("instance metadata {path} got no answer within {timeout:?}")]
    Timeout { path: String, timeout: Duration },
    #[error("instance metadata {path} answered HTTP {status}")]
    Status { path: String, status: u16 },
    #[error("instance metadata {path} answered something that is not HTTP: {source}")]
    Malformed { path: String, source: NotHttp },
}

/// An `--imds-endpoint` the client cannot use.
#[derive(Debug, thiserror::Error)]
#[error("--imds-endpoint {endpoint:?} {why}")]
pub struct BadEndpoint {
    pub endpoint: String,
    pub why: &'static str,
}

impl ImdsError {
    /// Worth another try soon: the network or IMDS itself, not an answer that will not change.
    fn is_transient(&self) -> bool {
        match self {
            ImdsError::Status { status, .. } => *status == 401 || *status >= 500 || *status == 429,
            ImdsError::Malformed { .. } => false,
            _ => true,
        }
    }
}

/// What instance metadata says about this instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImdsIdentity {
    pub instance_id: String,
    pub instance_type: Option<String>,
    pub zone: Option<String>,
    pub region: Option<String>,
    /// Network interfaces attached to the instance (`network/interfaces/macs/`).
    pub network_interfaces: Option<u32>,
    /// Set on an Outpost only (elsewhere the path answers 404).
    pub outpost_arn: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ImdsClient {
    /// `host:port`, as connected to and sent in `Host:`.
    authority: String,
    endpoint: String,
    pub timeout: Duration,
    pub attempts: u32,
    pub backoff: Duration,
}

impl ImdsClient {
    /// `endpoint` is `http://host[:port]` (IPv6 hosts in brackets, as `http://[fd00:ec2::254]`).
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self, BadEndpoint> {
        let bad = |why| BadEndpoint {
            endpoint: endpoint.to_string(),
            why,
        };
        let rest = endpoint
            .strip_prefix("http://")
            .ok_or_else(|| bad("must start with http:// (IMDS is plain HTTP)"))?;
        let host = rest.trim_end_matches('/');
        if host.is_empty() || host.contains('/') {
            return Err(bad("must be http://host[:port] without a path"));
        }
        let has_port = match host.rfind(']') {
            Some(close) => host[close..].contains(':'),
            None => host.contains(':'),
        };
        let authority = if has_port {
            host.to_string()
        } else {
            format!("{host}:80")
        };
        Ok(ImdsClient {
            authority,
            endpoint: format!("http://{host}"),
            timeout,
            attempts: 3,
            backoff: Duration::from_millis(200),
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The token, then the identity paths; the whole sequence is retried a few times with
    /// backoff on errors that may pass. Returns the last error otherwise.
    pub async fn identity(&self) -> Result<ImdsIdentity, ImdsError> {
        self.retried(|| self.identity_once()).await
    }

    /// Only whether the instance is on an Outpost: asked when flags and DMI gave the rest.
    pub async fn outpost_arn(&self) -> Result<Option<String>, ImdsError> {
        self.retried(|| async {
            let token = self.token().await?;
            self.get(&token, "outpost-arn").await
        })
        .await
    }

    async fn retried<T, F, Fut>(&self, once: F) -> Result<T, ImdsError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, ImdsError>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match once().await {
                Ok(found) => return Ok(found),
                Err(e) if attempt < self.attempts && e.is_transient() => {
                    tracing::debug!(error = %e, attempt, "instance metadata: retrying");
                    tokio::time::sleep(self.backoff * 2u32.pow(attempt - 1)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn identity_once(&self) -> Result<ImdsIdentity, ImdsError> {
        let token = self.token().await?;
        let instance_id =
            self.get(&token, "instance-id")
                .await?
                .ok_or_else(|| ImdsError::Status {
                    path: "meta-data/instance-id".into(),
                    status: 404,
                })?;
        let instance_type = self.get(&token, "instance-type").await?;
        let zone = self.get(&token, "placement/availability-zone").await?;
        let region = self.get(&token, "placement/region").await?;
        let network_interfaces = self
            .get(&token, "network/interfaces/macs/")
            .await?
            .map(|macs| macs.lines().filter(|l| !l.trim().is_empty()).count() as u32);
        let outpost_arn = self.get(&token, "outpost-arn").await?;
        Ok(ImdsIdentity {
            instance_id,
            instance_type,
            zone,
            region,
            network_interfaces,
            outpost_arn,
        })
    }

    async fn token(&self) -> Result<String, ImdsError> {
        let path = "/latest/api/token";
        let head = format!(
            "PUT {path} HTTP/1.1\r\nHost: {}\r\nX-aws-ec2-metadata-token-ttl-seconds: \
             {TOKEN_TTL_SECONDS}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.authority
        );
        let resp = match self.exchange(path, &head).await {
            Err(ImdsError::Timeout { timeout, .. }) => {
                return Err(ImdsError::TokenTimeout {
                    endpoint: self.endpoint.clone(),
                    timeout,
                });
            }
            other => other?,
        };
        if resp.status != 200 || resp.body.trim().is_empty() {
            return Err(ImdsError::Status {
                path: path.into(),
                status: resp.status,
            });
        }
        Ok(resp.body.trim().to_string())
    }

    /// `Ok(None)` when the path does not exist (404): older instances lack `placement/region`.
    async fn get(&self, token: &str, item: &str) -> Result<Option<String>, ImdsError> {
        let path = format!("/latest/meta-data/{item}");
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nX-aws-ec2-metadata-token: {token}\r\n\
             Connection: close\r\n\r\n",
            self.authority
        );
        let resp = self.exchange(&path, &head).await?;
        match resp.status {
            200 => {
                let value = resp.body.trim().to_string();
                Ok((!value.is_empty()).then_some(value))
            }
            404 => Ok(None),
            status => Err(ImdsError::Status { path, status }),
        }
    }

    async fn exchange(&self, path: &str, head: &str) -> Result<Response, ImdsError> {
        let io = async {
            let mut stream =
                TcpStream::connect(&self.authority)
                    .await
                    .map_err(|e| ImdsError::Unreachable {
                        endpoint: self.endpoint.clone(),
                        why: e.to_string(),
                    })?;
            let broken = |e: std::io::Error| ImdsError::Unreachable {
                endpoint: self.endpoint.clone(),
                why: e.to_string(),
            };
            stream.write_all(head.as_bytes()).await.map_err(broken)?;
            let mut raw = Vec::new();
            (&mut stream)
                .take(MAX_RESPONSE as u64 + 1)
                .read_to_end(&mut raw)
                .await
                .map_err(broken)?;
            Ok(raw)
        };
        let raw =
            tokio::time::timeout(self.timeout, io)
                .await
                .map_err(|_| ImdsError::Timeout {
                    path: path.to_string(),
                    timeout: self.timeout,
                })??;
        parse_response(&raw).map_err(|source| ImdsError::Malformed {
            path: path.to_string(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let c = ImdsClient::new("http://169.254.169.254", Duration::from_secs(1)).unwrap();
        assert_eq!(c.authority, "169.254.169.254:80");
        let c = ImdsClient::new("http://127.0.0.1:8080/", Duration::from_secs(1)).unwrap();
        assert_eq!(c.authority, "127.0.0.1:8080");
        let c = ImdsClient::new("http://[fd00:ec2::254]", Duration::from_secs(1)).unwrap();
        assert_eq!(c.authority, "[fd00:ec2::254]:80");
        assert!(ImdsClient::new("https://169.254.169.254", Duration::from_secs(1)).is_err());
        assert!(ImdsClient::new("http://h/latest", Duration::from_secs(1)).is_err());
    }

    #[test]
    fn token_timeout_names_the_hop_limit() {
        let e = ImdsError::TokenTimeout {
            endpoint: DEFAULT_ENDPOINT.into(),
            timeout: Duration::from_secs(1),
        };
        assert!(e.to_string().contains("hop limit"));
        assert!(e.to_string().contains("--node-id"));
    }
}
