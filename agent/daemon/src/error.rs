//! The hand-off of blocking host work to tokio's pool. The domain's error enum is the core's
//! (`ebs_node_core::error`), named there.

use ebs_node_core::error::{Error, Result};

/// Runs blocking host work off the async executor and flattens the join error.
pub async fn blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::BlockingTaskFailed {
            source: Box::new(e),
        })?
}
