//! A gRPC channel to a CSI unix socket.

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint as TonicEndpoint, Uri};

/// Connects to `unix:///path.sock`, `unix:/path.sock` or a bare absolute path. The channel
/// reconnects lazily.
pub async fn channel(endpoint: &str) -> Result<Channel, String> {
    let path = PathBuf::from(ebs_node_core::config::unix_socket_path(endpoint).unwrap_or(endpoint));
    if !path.is_absolute() {
        return Err(format!(
            "endpoint {endpoint:?}: use unix:///absolute/path.sock"
        ));
    }
    // The URI is a placeholder: the connector below decides where bytes go.
    let ep = TonicEndpoint::try_from("http://localhost").map_err(|e| e.to_string())?;
    ep.connect_with_connector(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    }))
    .await
    .map_err(|e| format!("cannot connect to {endpoint}: {e}"))
}
