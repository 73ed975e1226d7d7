//! An instance metadata answer, as bytes off the socket: an HTTP/1.1 head and a body that may be
//! chunked. The daemon's client sends the requests; this reads what came back.

/// Metadata answers are tiny; anything larger is not IMDS.
pub const MAX_RESPONSE: usize = 64 * 1024;

/// A well-formed answer: its status and its body as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// What is not HTTP about an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotHttp {
    #[error("longer than {MAX_RESPONSE} bytes")]
    TooLong,
    #[error("bad status line {0:?}")]
    StatusLine(String),
    /// Anything else: the part of the answer that is wrong.
    #[error("{0}")]
    Framing(&'static str),
}

/// Parses one answer; `Err` says what is not HTTP about it.
pub fn parse_response(raw: &[u8]) -> Result<Response, NotHttp> {
    use NotHttp::Framing;
    if raw.len() > MAX_RESPONSE {
        return Err(NotHttp::TooLong);
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(Framing("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| Framing("headers are not UTF-8"))?;
    let mut body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|s| s.get(2..5))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| NotHttp::StatusLine(status_line.to_string()))?;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value.parse().map_err(|_| Framing("bad Content-Length"))?;
            body = body
                .get(..n)
                .ok_or(Framing("body shorter than its Content-Length"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.eq_ignore_ascii_case("chunked")
        {
            chunked = true;
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    let body = String::from_utf8(body).map_err(|_| Framing("body is not UTF-8"))?;
    Ok(Response { status, body })
}

fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, NotHttp> {
    use NotHttp::Framing;
    let mut out = Vec::new();
    loop {
        let eol = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or(Framing("bad chunk"))?;
        let size_text = std::str::from_utf8(&raw[..eol]).map_err(|_| Framing("bad chunk size"))?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| Framing("bad chunk size"))?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(
            raw.get(..size)
                .ok_or(Framing("chunk shorter than its size"))?,
        );
        raw = raw
            .get(size + 2..)
            .ok_or(Framing("chunk without its CRLF"))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "hello"));
        let r = parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            .unwrap();
        assert_eq!(r.body, "abcde");
        let r = parse_response(b"HTTP/1.0 401 Unauthorized\r\n\r\n").unwrap();
        assert_eq!(r.status, 401);
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab").is_err());
    }
}
