use clap::Parser;

use ebs_node_agent::cli::{Cli, Command};
use ebs_node_agent::{client, logging, recover, server, status};

fn main() {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_)) {
        ebs_node_agent::host::malloc::tune();
    }
    // The client's calls are light and mostly wait on the agent; one thread drives them without
    // waking a second runtime thread at every reply (under the bench that costs the agent CPU).
    let mut builder = if matches!(cli.command, Command::Client(_)) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2);
        b
    };
    let runtime = match builder.max_blocking_threads(64).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = match cli.command {
        Command::Serve(args) if args.print_config => {
            ebs_node_agent::print_config::print(&args);
            0
        }
        Command::Serve(args) => {
            logging::init(args.log_format);
            match runtime.block_on(server::serve(*args)) {
                Ok(()) => 0,
                Err(fatal) => {
                    tracing::error!("{}", fatal.message);
                    eprintln!("error: {}", fatal.message);
                    fatal.code
                }
            }
        }
        Command::Client(args) => runtime.block_on(client::run(args)),
        Command::Status(args) => runtime.block_on(status::status(args)),
        Command::Recover(args) => recover::run(args),
        Command::EbsStats(args) => ebs_node_agent::ebs_stats::run(args),
    };
    // Blocking host work still running after the grace period must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    std::process::exit(code);
}
