//! A scrape of the agent's metrics endpoint, with nothing but std.

use std::io::{Read, Write};
use std::time::Duration;

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .expect("local address")
        .port()
}

/// A raw HTTP/1.1 GET: (status line, headers and body).
pub fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    let (head, body) = text.split_once("\r\n\r\n").expect("http response");
    (head.to_string(), body.to_string())
}

/// The value of the sample line that starts with `series ` (exact name and labels).
pub fn sample(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in:\n{body}"))
        .parse()
        .expect("number")
}
