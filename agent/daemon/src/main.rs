use ebs_node_agent::cli::{Cli, Command};
use ebs_node_agent::commands::{recover, status};
use ebs_node_agent::{logging, server};
use ebs_node_tools::client;

/// What packagers install beside the binary, generated from the clap definitions.
mod packaging_output {
    use std::path::Path;

    use ebs_node_agent::cli::Cli;

    pub fn completions(shell: clap_complete::Shell) -> i32 {
        let mut cmd = Cli::command();
        clap_complete::generate(shell, &mut cmd, "ebs-node-agent", &mut std::io::stdout());
        0
    }

    /// The top page to stdout, or every page (the top one and one per subcommand, whose flags
    /// the top page does not list) into `dir`.
    pub fn man(dir: Option<&Path>) -> i32 {
        let written = match dir {
            None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()),
            Some(dir) => write_pages(dir),
        };
        match written {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: writing the man page: {e}");
                1
            }
        }
    }

    fn write_pages(dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let mut top = Cli::command();
        top.build();
        let page = |cmd: clap::Command, name: &str| -> std::io::Result<()> {
            let mut file = std::fs::File::create(dir.join(format!("{name}.1")))?;
            clap_mangen::Man::new(cmd).render(&mut file)
        };
        // After build() a subcommand's display name is `ebs-node-agent-<sub>`, its page's title.
        for sub in top.get_subcommands().filter(|s| s.get_name() != "help") {
            let name = sub.get_display_name().unwrap_or(sub.get_name()).to_string();
            page(sub.clone().version(env!("CARGO_PKG_VERSION")), &name)?;
        }
        page(top, "ebs-node-agent")
    }
}

fn main() {
    let cli = Cli::parse_args();
    if matches!(cli.command, Command::Serve(_)) {
        ebs_node_host::malloc::tune();
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
            ebs_node_agent::commands::print_config::print(&args);
            0
        }
        Command::Serve(args) => {
            logging::init(args.log_format, args.log_level());
            ebs_node_agent::upstream_cli::warn_ignored(&args);
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
        Command::Doctor(args) => runtime.block_on(ebs_node_agent::commands::doctor::run(args)),
        Command::Completions { shell } => packaging_output::completions(shell),
        Command::Man { dir } => packaging_output::man(dir.as_deref()),
        Command::EbsStats(args) => ebs_node_agent::commands::ebs_stats::run(args),
        Command::PreStop(args) => {
            logging::init(ebs_node_agent::settings::LogFormat::Text, "info");
            runtime.block_on(ebs_node_agent::kube_duties::pre_stop(args))
        }
    };
    // Blocking host work still running after the grace period must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    std::process::exit(code);
}
