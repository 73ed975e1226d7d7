//! Any well-formed gRPC client works over the unix socket, whatever `:authority` it sends:
//! - `path_authority`: a hand-made HTTP/2 request that names the socket path as `:authority`
//!   (as gRPC C-core >= 1.57 and grpc-java do), plain and percent-encoded;
//! - `python_grpcio_cycle`: a real Python grpcio client (C-core) through Probe and a whole
//!   create / attach / stage / publish / write cycle. Its interpreter is `$EBS_PYTHON` or the
//!   venv tests/deps.sh makes at target/grpcio-venv; outside CI it skips without one.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ebs_tests::*;
use prost::Message;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK "literal without indexing, new name" fields (every string here is under 127 bytes).
fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (n, v) in fields {
        b.push(0);
        for s in [n, v] {
            assert!(s.len() < 127);
            b.push(s.len() as u8);
            b.extend_from_slice(s.as_bytes());
        }
    }
    b
}

/// Sends one Probe with `authority` on a raw HTTP/2 connection; returns the answer's message,
/// or what the server did instead (RST_STREAM, GOAWAY).
fn raw_probe(socket: &Path, authority: &str) -> Result<csi::ProbeResponse, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let headers = header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/csi.v1.Identity/Probe"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4, 1, &headers)); // HEADERS, END_HEADERS
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // an empty ProbeRequest, END_STREAM
    s.write_all(&out).map_err(|e| e.to_string())?;
    loop {
        let mut head = [0u8; 9];
        s.read_exact(&mut head)
            .map_err(|e| format!("reading: {e}"))?;
        let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).map_err(|e| e.to_string())?;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
        match (head[3], stream) {
            (0x0, 1) if payload.len() >= 5 => {
                return csi::ProbeResponse::decode(&payload[5..]).map_err(|e| e.to_string());
            }
            (0x3, 1) => return Err(format!("RST_STREAM {payload:?}")),
            (0x7, _) => return Err(format!("GOAWAY {payload:?}")),
            (0x4, 0) if head[4] & 0x1 == 0 => {
                // Acknowledge the server's SETTINGS, as every client does.
                s.write_all(&frame(0x4, 0x1, 0, &[]))
                    .map_err(|e| e.to_string())?;
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn path_authority() {
    let scratch = Scratch::new("path-authority");
    let agent = Agent::start(&scratch, AgentOpts::default()).await;
    let socket = agent.socket.clone();
    let path = socket.display().to_string();
    let encoded = path.replace('/', "%2F");
    tokio::task::spawn_blocking(move || {
        for authority in ["localhost", path.as_str(), encoded.as_str()] {
            let r = raw_probe(&socket, authority);
            assert!(
                matches!(&r, Ok(p) if p.ready == Some(true)),
                ":authority {authority:?}: {r:?}"
            );
        }
    })
    .await
    .expect("probe task");
    // And a Rust client afterwards, on a fresh connection, still works.
    agent
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .expect("tonic probe");
}

/// The interpreter with grpcio and grpcio-tools, or why there is none.
fn python() -> Result<PathBuf, String> {
    let py = match std::env::var_os("EBS_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/grpcio-venv/bin/python"),
    };
    let ok = Command::new(&py)
        .args(["-c", "import grpc, grpc_tools"])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(py)
    } else {
        Err(format!(
            "{} cannot import grpc and grpc_tools (run tests/deps.sh, or set EBS_PYTHON)",
            py.display()
        ))
    }
}

#[tokio::test]
async fn python_grpcio_cycle() {
    let test = "python_grpcio_cycle";
    if !require_root(test) {
        return;
    }
    let py = match python() {
        Ok(p) => p,
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: {why}; CI=true: refusing to skip")
        }
        Err(why) => {
            skip(test, &why);
            return;
        }
    };
    let scratch = Scratch::new("grpcio");
    // The CSI-Addons socket too: the same :authority fix (a sixteenth fresh review's F4).
    let addons = scratch.join("run/addons.sock");
    let mut opts = AgentOpts::default();
    opts.args.push("--csi-addons-endpoint".into());
    opts.args.push(format!("unix://{}", addons.display()));
    let agent = Agent::start(&scratch, opts).await;
    // Stubs from the very proto files the agent is built from.
    let stubs = scratch.join("stubs");
    std::fs::create_dir_all(&stubs).expect("stub dir");
    let protos = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
    let out = Command::new(&py)
        .args(["-m", "grpc_tools.protoc"])
        .arg(format!("-I{}", protos.display()))
        .arg(format!("--python_out={}", stubs.display()))
        .arg(format!("--grpc_python_out={}", stubs.display()))
        .arg("csi/v1/csi.proto")
        .output()
        .expect("grpc_tools.protoc");
    assert!(
        out.status.success(),
        "protoc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&py)
        .args(["-m", "grpc_tools.protoc"])
        .arg(format!(
            "-I{}",
            protos.join("csi-addons/identity").display()
        ))
        .arg(format!("--python_out={}", stubs.display()))
        .arg(format!("--grpc_python_out={}", stubs.display()))
        .arg("identity.proto")
        .output()
        .expect("grpc_tools.protoc");
    assert!(
        out.status.success(),
        "protoc (CSI-Addons): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/csi_cycle.py");
    let work = agent.work.join("grpcio");
    let out = tokio::task::spawn_blocking({
        let (py, socket, stubs, work) = (py, agent.socket.clone(), stubs, work);
        move || {
            Command::new(py)
                .arg(script)
                .arg(socket)
                .arg(stubs)
                .arg(work)
                .arg(addons)
                .output()
                .expect("python")
        }
    })
    .await
    .expect("python task");
    assert!(
        out.status.success(),
        "grpcio client failed:\n{}\nagent log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        agent.log_text()
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON from the script");
    println!("grpcio client: {r}");
    assert_eq!(r["ready"], true);
    assert_eq!(r["driver"], "ebs.csi.aws.com");
    assert_eq!(r["read_back"], "from grpcio");
    assert_eq!(r["stats_units"], 2, "bytes and inodes");
    assert_eq!(r["unknown_volume_stats"], "NOT_FOUND");
    assert_eq!(
        r["addons_driver"], "ebs.csi.aws.com",
        "CSI-Addons GetIdentity"
    );
}
