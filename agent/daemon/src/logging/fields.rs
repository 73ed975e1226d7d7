//! The text format's field formatter: one event is one line, whatever its values hold.
//!
//! tracing writes a `%` field with its Display as is, so a devicePath holding a newline once
//! forged a whole log line. Here every field is rendered first and then written so that it
//! stays one token of its own line:
//! - a value made only of printable ASCII other than quotes, backslashes, `=` and spaces is
//!   written bare (`ms=3`, `code=NotFound`);
//! - a value that already is one well-formed quoted string (what `?` and `&str` fields give) is
//!   written as it is;
//! - anything else is written as a quoted string with Rust's escapes (`\n`, `\"`, `\u{1b}`).
//!
//! The message is not quoted (it is the line's text), but its control characters are escaped.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// Formats every field of a text log line escaped (see the module's comment).
pub struct Escaped;

impl<'w> FormatFields<'w> for Escaped {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = Visitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Visitor<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Visitor<'_> {
    fn write(&mut self, field: &Field, rendered: &str) {
        if self.result.is_err() {
            return;
        }
        let sep = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        let name = field.name();
        self.result = if name == "message" {
            write!(self.writer, "{sep}{}", escape_message(rendered))
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name);
            write!(self.writer, "{sep}{name}={}", escape_value(rendered))
        };
    }
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write(field, value);
        } else {
            // A string field is quoted, as tracing's own formatter does.
            self.write(field, &format!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, &format!("{value:?}"));
    }
}

/// A field's rendered value as one token: bare, already quoted, or quoted and escaped here.
pub fn escape_value(rendered: &str) -> std::borrow::Cow<'_, str> {
    if is_bare(rendered) || is_quoted(rendered) {
        rendered.into()
    } else {
        format!("{rendered:?}").into()
    }
}

/// The message with its control characters escaped (so it stays on its line and never drives
/// the terminal); everything else as it is.
pub fn escape_message(rendered: &str) -> std::borrow::Cow<'_, str> {
    if !rendered.chars().any(needs_escape_in_text) {
        return rendered.into();
    }
    let mut out = String::with_capacity(rendered.len() + 8);
    for c in rendered.chars() {
        if needs_escape_in_text(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// Control characters, and the invisible ones that reorder or hide text (bidi overrides,
/// line and paragraph separators).
fn needs_escape_in_text(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}')
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

fn is_bare(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'='))
}

/// One quoted string whose inner quotes are all escaped and that holds no character a reader
/// could take for the end of the line (what Rust's Debug of a string gives).
fn is_quoted(s: &str) -> bool {
    let Some(inner) = s.strip_prefix('"').and_then(|rest| rest.strip_suffix('"')) else {
        return false;
    };
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            // An escape takes the next character with it (the guard consumes it), which must
            // not be one that ends the line either.
            '\\' if chars.next().is_none_or(needs_escape_in_text) => return false,
            '"' => return false,
            c if needs_escape_in_text(c) => return false,
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_tokens_stay_bare_and_quoted_strings_stay_as_they_are() {
        assert_eq!(escape_value("NotFound"), "NotFound");
        assert_eq!(escape_value("/dev/loop3"), "/dev/loop3");
        assert_eq!(escape_value("\"a b\""), "\"a b\"");
        assert_eq!(escape_value("\"say \\\"hi\\\"\""), "\"say \\\"hi\\\"\"");
    }

    #[test]
    fn anything_else_becomes_one_escaped_token() {
        let forged = "/dev/x\n2026-01-01T00:00:00Z  INFO ok rpc=\"NodeUnstageVolume\"";
        let out = escape_value(forged);
        assert!(!out.contains('\n'), "{out}");
        assert!(out.starts_with('"') && is_quoted(&out), "{out}");
        for evil in [
            "a b",
            "a=b",
            "\"a\" rpc=\"b\"",
            "\"a\\\"",
            "x\u{1b}[31mred",
            "\"\u{1b}[2J\"",
            "tab\there",
            "\u{202e}gnp.exe",
            "",
            "\"\n\"",
            "\"\\\n\"",
        ] {
            let out = escape_value(evil);
            assert!(is_quoted(&out), "{evil:?} → {out}");
            assert!(!out.contains(['\n', '\u{1b}', '\t', '\u{202e}']), "{out}");
        }
    }

    #[test]
    fn messages_keep_their_text_on_one_line() {
        assert_eq!(escape_message("serving"), "serving");
        let out = escape_message("a\nb\r\u{1b}[0m\u{2028}c");
        assert_eq!(out, "a\\nb\\r\\u{1b}[0m\\u{2028}c");
    }
}
