//! The bench's gRPC floor server (`ebs-node-agent client bench --grpc-floor` starts it from
//! beside its own executable, docs/performance.md). A binary of its own, so that the agent's
//! binary carries none of it. It runs as the agent does: the same malloc settings and a runtime
//! of two async workers, so that what it costs differs from the agent's only by the agent's logic.

use clap::Parser;
use ebs_node_tools::client::bench::grpc_floor::{ServeArgs, serve};

#[derive(Parser, Debug)]
#[command(name = "ebs-bench-grpc-floor", version)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

fn main() {
    let cli = Cli::parse();
    ebs_node_host::malloc::tune();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build();
    let code = match runtime.map_err(|e| e.to_string()) {
        Ok(rt) => match rt.block_on(serve(&cli.args)) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: ebs-bench-grpc-floor: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("error: ebs-bench-grpc-floor: cannot start the async runtime: {e}");
            1
        }
    };
    std::process::exit(code);
}
