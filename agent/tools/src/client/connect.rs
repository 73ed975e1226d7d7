//! A gRPC channel to a CSI unix socket.

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint as TonicEndpoint, Uri};

/// Why no channel could be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("endpoint {0:?}: use unix:///absolute/path.sock")]
    NotAbsolute(String),
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Connects to `unix:///path.sock`, `unix:/path.sock` or a bare absolute path. The channel
/// reconnects lazily.
pub async fn channel(endpoint: &str) -> Result<Channel, ConnectError> {
    let path = PathBuf::from(ebs_node_core::config::unix_socket_path(endpoint).unwrap_or(endpoint));
    if !path.is_absolute() {
        return Err(ConnectError::NotAbsolute(endpoint.to_string()));
    }
    // The URI is a placeholder (a constant, always valid): the connector decides where bytes go.
    let ep = TonicEndpoint::from_static("http://localhost");
    ep.connect_with_connector(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    }))
    .await
    .map_err(|source| ConnectError::Connect {
        endpoint: endpoint.to_string(),
        source,
    })
}
