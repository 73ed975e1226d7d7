//! Every subcommand and every option of the agent's command line says what it is for: a blank
//! line in `--help` (or in the man pages and completions generated from the same definitions)
//! leaves a newcomer guessing. Walks the whole clap tree; hidden entries (the upstream driver's
//! compatibility words and flags) and clap's own `--help`/`--version` are left out.

use ebs_node_agent::cli::Cli;

/// The blank entries below `cmd`, as `path: what` lines.
fn blanks(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if arg.is_hide_set() || id == "help" || id == "version" {
            continue;
        }
        let has_help = [arg.get_help(), arg.get_long_help()]
            .iter()
            .flatten()
            .any(|h| !h.to_string().trim().is_empty());
        if !has_help {
            let name = arg
                .get_long()
                .map(|l| format!("--{l}"))
                .unwrap_or_else(|| format!("<{id}>"));
            out.push(format!("{path}: option {name} has no help"));
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let sub_path = format!("{path} {}", sub.get_name());
        let has_about = [sub.get_about(), sub.get_long_about()]
            .iter()
            .flatten()
            .any(|h| !h.to_string().trim().is_empty());
        if !has_about {
            out.push(format!("{sub_path}: subcommand has no description"));
        }
        blanks(sub, &sub_path, out);
    }
}

#[test]
fn every_subcommand_and_option_has_a_help_line() {
    let mut cmd = Cli::command();
    // Global arguments are propagated to subcommands only once the tree is built.
    cmd.build();
    let mut out = Vec::new();
    blanks(&cmd, cmd.get_name(), &mut out);
    assert!(
        out.is_empty(),
        "{} blank help entries:\n{}",
        out.len(),
        out.join("\n")
    );
}

#[test]
fn the_walk_sees_a_blank_when_there_is_one() {
    let cmd = clap::Command::new("t")
        .about("top")
        .subcommand(
            clap::Command::new("said")
                .about("has one")
                .arg(clap::Arg::new("x").long("x").help("an x")),
        )
        .subcommand(clap::Command::new("bare").arg(clap::Arg::new("y").long("y")))
        .subcommand(clap::Command::new("hidden").hide(true));
    let mut out = Vec::new();
    blanks(&cmd, "t", &mut out);
    assert_eq!(
        out,
        vec![
            "t bare: subcommand has no description".to_string(),
            "t bare: option --y has no help".to_string(),
        ]
    );
}

/// A description that is only an RPC's name ("NodeGetInfo." or "DeleteVolume") tells a newcomer
/// nothing the subcommand's name did not: what it does must be said in words.
fn rpc_name_only(about: &str) -> bool {
    let word = about.trim().trim_end_matches('.');
    !word.is_empty()
        && !word.contains(char::is_whitespace)
        && word.starts_with(|c: char| c.is_ascii_uppercase())
        && word.chars().skip(1).any(|c| c.is_ascii_uppercase())
}

/// The subcommands below `cmd` described only by an RPC's name, as `path: about` lines.
fn rpc_only(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let sub_path = format!("{path} {}", sub.get_name());
        if let Some(about) = sub.get_about().map(|a| a.to_string())
            && rpc_name_only(&about)
        {
            out.push(format!("{sub_path}: {about:?}"));
        }
        rpc_only(sub, &sub_path, out);
    }
}

#[test]
fn no_subcommand_is_described_by_an_rpc_name_alone() {
    assert!(rpc_name_only("NodeGetInfo."));
    assert!(rpc_name_only("DeleteVolume"));
    assert!(!rpc_name_only(
        "NodeGetInfo: this node's id, attach limit and topology."
    ));
    assert!(!rpc_name_only("Serve CSI on a unix socket."));
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = Vec::new();
    rpc_only(&cmd, cmd.get_name(), &mut out);
    assert!(
        out.is_empty(),
        "{} subcommands say only which RPC they call, not what they do:\n{}",
        out.len(),
        out.join("\n")
    );
}

/// `client`'s options work anywhere on its line, as --json and --timeout always did.
#[test]
fn client_options_work_after_the_subcommand() {
    use ebs_node_agent::cli::Command;
    let endpoint = "unix:///run/elsewhere/csi.sock";
    for words in [
        vec!["client", "--endpoint", endpoint, "node", "info"],
        vec!["client", "node", "--endpoint", endpoint, "info"],
        vec!["client", "node", "info", "--endpoint", endpoint],
        vec![
            "client",
            "identity",
            "probe",
            "--json",
            "--timeout",
            "5s",
            "--endpoint",
            endpoint,
        ],
    ] {
        let line = words.join(" ");
        let cli = ebs_node_agent::cli::Cli::try_parse_from(
            std::iter::once("ebs-node-agent").chain(words.iter().copied()),
        )
        .unwrap_or_else(|e| panic!("`{line}` refused:\n{e}"));
        let Command::Client(args) = cli.command else {
            panic!("`{line}`: not the client");
        };
        assert_eq!(args.endpoint, endpoint, "`{line}`");
    }
}
