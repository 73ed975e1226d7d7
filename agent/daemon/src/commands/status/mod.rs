//! `status`: what the agent knows, from the running agent (which holds the state file's lock)
//! or, when none runs, from the state file itself. Text for people, `--json` for scripts; both
//! come from the same document (`inventory::snapshot`).

mod clock;
#[cfg(test)]
mod tests;
pub mod text;

use serde_json::Value;

use ebs_store::Store;

use crate::cli::StatusArgs;
use crate::settings::STATE_FILE;

pub use self::text::Source;

/// Prints the document: compact JSON, or the text report.
pub fn print(value: &Value, as_json: bool, source: &Source) {
    if as_json {
        println!("{value}");
    } else {
        print!(
            "{}",
            text::render(value, source, ebs_node_core::records::now_unix_ms())
        );
    }
}

async fn from_agent(endpoint: &str) -> Option<Value> {
    let channel = ebs_node_tools::client::connect::channel(endpoint)
        .await
        .ok()?;
    let mut admin = ebs_proto::admin::admin_client::AdminClient::new(channel);
    let mut req = tonic::Request::new(ebs_proto::admin::StatusRequest {});
    req.set_timeout(std::time::Duration::from_secs(10));
    let resp = admin.status(req).await.ok()?;
    serde_json::from_str(&resp.into_inner().json).ok()
}

pub async fn status(args: StatusArgs) -> i32 {
    if args.endpoint.path().exists()
        && let Some(v) = from_agent(&args.endpoint.url()).await
    {
        print(&v, args.json, &Source::Agent(args.endpoint.url()));
        return 0;
    }
    let path = args.state_dir.join(STATE_FILE);
    match Store::open_read_only(&path).and_then(|s| crate::inventory::snapshot(&s)) {
        Ok(v) => {
            print(&v, args.json, &Source::File(path.display().to_string()));
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
