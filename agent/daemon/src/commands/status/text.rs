//! `status` as text for people: one aligned block per volume, its state in words, times as
//! ISO-8601 and how long ago. It renders the same document `--json` prints, so both say the same.

use std::fmt::Write;

use serde_json::Value;

use super::clock;

/// Where the document came from. A running agent answers for the present (an unfinished step
/// may be running now); the file of a stopped agent shows what it left (an unfinished step was
/// interrupted).
pub enum Source {
    Agent(String),
    File(String),
}

const LABEL: usize = 14;

/// The whole report.
pub fn render(doc: &Value, source: &Source, now_ms: u64) -> String {
    let mut out = String::new();
    let live = matches!(source, Source::Agent(_));
    match source {
        Source::Agent(ep) => writeln!(out, "from the running agent on {ep}"),
        Source::File(path) => writeln!(out, "from the state file {path} (no agent answered)"),
    }
    .ok();
    let none = Vec::new();
    let volumes = doc["volumes"].as_array().unwrap_or(&none);
    if volumes.is_empty() {
        out.push_str("\nno staged or published volumes\n");
    }
    for v in volumes {
        out.push('\n');
        volume(&mut out, v, live, now_ms);
    }
    for l in doc["loop_volumes"].as_array().unwrap_or(&none) {
        out.push('\n');
        loop_volume(&mut out, l);
    }
    out
}

fn line(out: &mut String, label: &str, value: impl std::fmt::Display) {
    writeln!(out, "  {label:<LABEL$}{value}").ok();
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("?")
}

fn volume(out: &mut String, v: &Value, live: bool, now_ms: u64) {
    writeln!(out, "volume {}", text(&v["volume_id"])).ok();
    line(out, "state", state(v, live));
    if let Some(a) = v["needs_attention"].as_object() {
        let since = a
            .get("since_unix_ms")
            .and_then(Value::as_u64)
            .map_or("?".to_string(), |ms| clock::when(ms, now_ms));
        let next = match (a["checking_for_s"].as_u64(), a["next_check_in_s"].as_u64()) {
            (Some(s), _) => format!("a check has been running for {s} s"),
            (None, Some(s)) => format!("checked again in {s} s, and by each call on it"),
            _ => "checked again in the background".to_string(),
        };
        let checks = a["failed_checks"].as_u64().unwrap_or(0);
        line(
            out,
            "attention",
            format!("since {since}, {checks} failed check(s); {next}"),
        );
    }
    if let Some(f) = v["filesystem"].as_object() {
        let how = match f.get("state").and_then(Value::as_str) {
            Some("done") => "formatted by the agent",
            Some("intent") => "format not finished",
            _ => "?",
        };
        line(
            out,
            "filesystem",
            format!(
                "{}, UUID {}, {how}",
                text(&f["fs_type"]),
                f.get("uuid").and_then(Value::as_str).unwrap_or("?")
            ),
        );
    }
    if let Some(s) = v["staged"].as_object() {
        line(out, "device", text(&s["device"]));
        let access = match s["access"]["type"].as_str() {
            Some("block") => "block device".to_string(),
            _ => {
                let flags: Vec<&str> = s["access"]["mount_flags"]
                    .as_array()
                    .map(|f| f.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                if flags.is_empty() {
                    "mounted".to_string()
                } else {
                    format!("mounted with {}", flags.join(","))
                }
            }
        };
        let unfinished = if s["progress"] == "complete" {
            ""
        } else {
            "; not finished"
        };
        line(
            out,
            "staged at",
            format!(
                "{} ({}, {access}{unfinished})",
                text(&s["staging_path"]),
                rw(&s["readonly"])
            ),
        );
    }
    for p in v["published"].as_array().into_iter().flatten() {
        let unfinished = if p["progress"] == "complete" {
            ""
        } else {
            "; not finished"
        };
        line(
            out,
            "published at",
            format!(
                "{} ({}{unfinished})",
                text(&p["target_path"]),
                rw(&p["readonly"])
            ),
        );
    }
    if let Some(l) = v["last_step"].as_object() {
        let at = l
            .get("at_unix_ms")
            .and_then(Value::as_u64)
            .map_or("?".to_string(), |ms| clock::when(ms, now_ms));
        line(
            out,
            "last step",
            format!(
                "{} step {}: {}, {at}",
                text(&l["op"]),
                text(&l["step"]),
                phase_word(l.get("phase").unwrap_or(&Value::Null))
            ),
        );
    }
}

fn rw(readonly: &Value) -> &'static str {
    if readonly.as_bool() == Some(true) {
        "read-only"
    } else {
        "read-write"
    }
}

fn phase_word(phase: &Value) -> &'static str {
    match phase.as_str() {
        Some("intent") => "started",
        Some("done") => "done",
        Some("failed") => "failed",
        _ => "?",
    }
}

/// Who completes an operation that stopped half-way.
fn finisher(op: &str) -> &'static str {
    match op {
        "stage" => "the next NodeStage or start-up finishes it",
        "publish" => "the next NodePublish finishes it",
        "unpublish" => "the next NodeUnpublish finishes it",
        "unstage" => "the next NodeUnstage finishes it",
        "expand" => "the next NodeExpandVolume finishes it",
        _ => "the next call for this volume finishes it",
    }
}

/// The volume's state in words: what is staged and published, or which operation stopped where.
pub fn state(v: &Value, live: bool) -> String {
    if let Some(why) = v["needs_attention"]["reason"].as_str() {
        return format!("needs attention: {why}");
    }
    if let Some(why) = v["unreadable"].as_str() {
        return format!("its records cannot be read: {why}");
    }
    let last = &v["last_step"];
    if let (Some(op), Some(step)) = (last["op"].as_str(), last["step"].as_str()) {
        match last["phase"].as_str() {
            Some("intent") if live => {
                return format!(
                    "{op} at {step}, not finished: running now, or interrupted ({})",
                    finisher(op)
                );
            }
            Some("intent") => return format!("{op} interrupted at {step}: {}", finisher(op)),
            Some("failed") => {
                return format!(
                    "{op} failed at {step}: the orchestrator's retry tries again (the agent's \
                     log says why)"
                );
            }
            _ => {}
        }
    }
    let staged = v["staged"].as_object();
    let publications = v["published"].as_array().map_or(0, Vec::len);
    match staged {
        Some(s) if s.get("progress").and_then(Value::as_str) != Some("complete") => {
            format!("stage not finished: {}", finisher("stage"))
        }
        Some(_) if publications == 1 => "staged and published".to_string(),
        Some(_) if publications > 1 => {
            format!("staged and published at {publications} targets")
        }
        Some(_) => "staged, not published".to_string(),
        None if publications > 0 => "published, not staged".to_string(),
        None => match v["filesystem"]["state"].as_str() {
            Some("intent") => {
                "not staged; its format was interrupted: the next NodeStage formats it again \
                 with the same UUID"
                    .to_string()
            }
            Some(_) => "not staged (its filesystem record stays, so it is never formatted again)"
                .to_string(),
            None => "not staged".to_string(),
        },
    }
}

fn loop_volume(out: &mut String, v: &Value) {
    writeln!(out, "loop volume {}", text(&v["name"])).ok();
    line(out, "volume id", text(&v["volume_id"]));
    if let Some(bytes) = v["capacity_bytes"].as_u64() {
        line(out, "size", human_bytes(bytes));
    }
    line(out, "file", text(&v["file"]));
    line(
        out,
        "attached",
        v["attached"].as_str().unwrap_or("no (not attached)"),
    );
}

/// `1 GiB`, `64 MiB`, `1.5 GiB`, `512 bytes`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
