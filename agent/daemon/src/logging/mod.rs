//! Logs go to stderr through tracing, as text or JSON, at the level `--v` gives; RUST_LOG, when
//! set, replaces it.
//!
//! Request-derived strings (volume ids, paths, context values, tool output) reach many log
//! lines, through `%` fields too, which tracing writes as they are. So the text format formats
//! every field itself (`fields::Escaped`): a value can never end its line, start another, or
//! carry a terminal escape, and one that is not a plain token is quoted. JSON escapes by itself.

mod fields;

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub use fields::Escaped;

use crate::settings::LogFormat;

pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.fmt_fields(Escaped).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
