//! A minimal Kubernetes API client: HTTPS to the API server with the pod's service-account token,
//! JSON in and out, one connection per request (a few requests per node start and drain; no pool
//! to keep healthy), every step bounded in time and size.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde::de::DeserializeOwned;
use tokio_rustls::{TlsConnector, rustls};

use crate::config::InCluster;

/// A list of every VolumeAttachment in a large cluster fits; a runaway answer does not.
const MAX_BODY: usize = 64 << 20;
/// One watch event (one object) at most.
const MAX_EVENT: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server's answer, its message escaped (it is outside input).
    #[error("the API server answered {code}: {message:?}")]
    Status { code: u16, message: String },
    #[error("cannot reach the API server: {0}")]
    Transport(String),
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
    #[error("unexpected answer from the API server: {0}")]
    Decode(String),
    #[error("{0}")]
    Config(String),
}

impl Error {
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

fn transport(e: impl std::fmt::Display) -> Error {
    Error::Transport(e.to_string())
}

pub struct Client {
    authority: String,
    server_name: ServerName<'static>,
    tls: TlsConnector,
    token_file: std::path::PathBuf,
    /// Connecting, the TLS handshake and the answer's head and body (not a watch's stream).
    pub request_timeout: Duration,
}

impl Client {
    pub fn new(cfg: &InCluster) -> Result<Client, Error> {
        let pem = std::fs::read(&cfg.ca_file)
            .map_err(|e| Error::Config(format!("{}: {e}", cfg.ca_file.display())))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert =
                cert.map_err(|e| Error::Config(format!("{}: {e}", cfg.ca_file.display())))?;
            roots
                .add(cert)
                .map_err(|e| Error::Config(format!("{}: {e}", cfg.ca_file.display())))?;
        }
        if roots.is_empty() {
            return Err(Error::Config(format!(
                "{}: no certificate",
                cfg.ca_file.display()
            )));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = ServerName::try_from(cfg.host.clone())
            .map_err(|e| Error::Config(format!("{:?}: {e}", cfg.host)))?;
        Ok(Client {
            authority: cfg.authority.clone(),
            server_name,
            tls: TlsConnector::from(Arc::new(tls)),
            token_file: cfg.token_file.clone(),
            request_timeout: Duration::from_secs(10),
        })
    }

    /// The token as kubelet last wrote it (projected tokens are rotated in place).
    fn token(&self) -> Result<String, Error> {
        let raw = std::fs::read_to_string(&self.token_file)
            .map_err(|e| Error::Config(format!("{}: {e}", self.token_file.display())))?;
        let token = raw.trim();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Error::Config(format!(
                "{}: not a bearer token",
                self.token_file.display()
            )));
        }
        Ok(token.to_string())
    }

    /// Sends one request on a new connection; the answer's head within the request timeout.
    async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<Response<Incoming>, Error> {
        let token = self.token()?;
        let limit = self.request_timeout;
        let exchange = async {
            let tcp = tokio::net::TcpStream::connect(&self.authority)
                .await
                .map_err(transport)?;
            let _ = tcp.set_nodelay(true);
            let tls = self
                .tls
                .connect(self.server_name.clone(), tcp)
                .await
                .map_err(transport)?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(transport)?;
            // Ends when the answer has been read or dropped.
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let mut req = Request::builder()
                .method(method)
                .uri(path)
                .header("host", &self.authority)
                .header("authorization", format!("Bearer {token}"))
                .header("accept", "application/json")
                .header(
                    "user-agent",
                    concat!("ebs-node-agent/", env!("CARGO_PKG_VERSION")),
                );
            if let Some(ct) = content_type {
                req = req.header("content-type", ct);
            }
            let req = req.body(Full::new(Bytes::from(body))).map_err(transport)?;
            sender.send_request(req).await.map_err(transport)
        };
        tokio::time::timeout(limit, exchange)
            .await
            .map_err(|_| Error::Timeout(limit))?
    }

    /// The whole body, bounded in size and time.
    async fn read(&self, resp: Response<Incoming>) -> Result<(u16, Bytes), Error> {
        let code = resp.status().as_u16();
        let limit = self.request_timeout;
        let body = tokio::time::timeout(limit, Limited::new(resp.into_body(), MAX_BODY).collect())
            .await
            .map_err(|_| Error::Timeout(limit))?
            .map_err(transport)?
            .to_bytes();
        Ok((code, body))
    }

    /// GET a JSON object; `None` when the server answers 404.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, Error> {
        let resp = self.send(Method::GET, path, None, Vec::new()).await?;
        let (code, body) = self.read(resp).await?;
        match code {
            200 => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| Error::Decode(e.to_string())),
            404 => Ok(None),
            _ => Err(status_error(code, &body)),
        }
    }

    /// PATCH with a JSON patch (RFC 6902): a failed `test` operation is a 422 from the server.
    pub async fn json_patch(&self, path: &str, patch: &serde_json::Value) -> Result<(), Error> {
        let body = serde_json::to_vec(patch).map_err(|e| Error::Decode(e.to_string()))?;
        let resp = self
            .send(
                Method::PATCH,
                path,
                Some("application/json-patch+json"),
                body,
            )
            .await?;
        let (code, body) = self.read(resp).await?;
        if (200..300).contains(&code) {
            Ok(())
        } else {
            Err(status_error(code, &body))
        }
    }

    /// Opens a watch (`path` carries `watch=true` and `timeoutSeconds`): its events in order.
    pub async fn watch(&self, path: &str) -> Result<Watch, Error> {
        let resp = self.send(Method::GET, path, None, Vec::new()).await?;
        if resp.status().as_u16() != 200 {
            let (code, body) = self.read(resp).await?;
            return Err(status_error(code, &body));
        }
        Ok(Watch {
            body: resp.into_body(),
            buf: Vec::new(),
        })
    }
}

fn status_error(code: u16, body: &[u8]) -> Error {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let message: String = message.chars().take(300).collect();
    Error::Status { code, message }
}

/// A watch's stream: one JSON object per line (`{"type": "MODIFIED", "object": {...}}`).
pub struct Watch {
    body: Incoming,
    buf: Vec<u8>,
}

#[derive(Debug, serde::Deserialize)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    pub object: serde_json::Value,
}

impl Watch {
    /// The next event; `None` when the server ended the watch. The caller bounds the wait.
    pub async fn next(&mut self) -> Result<Option<Event>, Error> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line)
                    .map(Some)
                    .map_err(|e| Error::Decode(e.to_string()));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(transport(e)),
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        while data.has_remaining() {
                            let chunk = data.chunk();
                            self.buf.extend_from_slice(chunk);
                            let n = chunk.len();
                            data.advance(n);
                        }
                    }
                    if self.buf.len() > MAX_EVENT {
                        return Err(Error::Decode("a watch event larger than 4 MiB".into()));
                    }
                }
            }
        }
    }
}
