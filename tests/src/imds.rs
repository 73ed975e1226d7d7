//! A local EC2 instance-metadata emulator on 127.0.0.1 (IMDSv2 token flow), with switches for
//! the failures the agent must survive. Switches can be flipped while it runs.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const TOKEN: &str = "emulated-token-AQAEAHG";

#[derive(Clone, Debug)]
pub struct Instance {
    pub instance_id: String,
    pub instance_type: String,
    pub zone: String,
    pub region: String,
    pub macs: Vec<String>,
    /// `outpost-arn` answers this; `None`: 404, as off an Outpost.
    pub outpost_arn: Option<String>,
}

impl Default for Instance {
    fn default() -> Self {
        Instance {
            instance_id: "i-0feedfacecafe0001".into(),
            instance_type: "m5.large".into(),
            zone: "eu-central-1b".into(),
            region: "eu-central-1".into(),
            macs: vec!["0a:00:00:00:00:01".into()],
            outpost_arn: None,
        }
    }
}

#[derive(Default)]
pub struct Switches {
    /// Close every connection without answering (IMDS off or blocked).
    pub down: AtomicBool,
    /// Metadata GETs without a valid token get 401 (IMDSv2 required). On by default.
    pub allow_v1: AtomicBool,
    /// The token PUT never gets an answer (what a hop limit of 1 looks like from a container).
    pub hang_token: AtomicBool,
    /// Metadata answers wait this long first.
    pub metadata_delay_ms: AtomicU64,
    pub token_requests: AtomicU32,
    pub metadata_requests: AtomicU32,
    /// Metadata GETs that came without a token.
    pub tokenless_requests: AtomicU32,
    /// The metadata items asked for, in order (`instance-id`, `outpost-arn`, ...).
    pub asked: Mutex<Vec<String>>,
}

/// The emulator; its task ends when this is dropped.
pub struct Imds {
    pub port: u16,
    pub switches: Arc<Switches>,
    pub instance: Arc<Mutex<Instance>>,
    task: tokio::task::JoinHandle<()>,
}

impl Imds {
    pub async fn start(instance: Instance) -> Imds {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind imds");
        let port = listener.local_addr().expect("addr").port();
        let switches = Arc::new(Switches::default());
        let instance = Arc::new(Mutex::new(instance));
        let (s, i) = (Arc::clone(&switches), Arc::clone(&instance));
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (s, i) = (Arc::clone(&s), Arc::clone(&i));
                tokio::spawn(async move {
                    let _ = serve_one(conn, &s, &i).await;
                });
            }
        });
        Imds {
            port,
            switches,
            instance,
            task,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn set(&self, switch: &AtomicBool, on: bool) {
        switch.store(on, Ordering::SeqCst);
    }

    /// The metadata items asked for so far.
    pub fn asked(&self) -> Vec<String> {
        self.switches.asked.lock().expect("asked").clone()
    }

    pub fn requests(&self) -> u32 {
        self.switches.token_requests.load(Ordering::SeqCst)
            + self.switches.metadata_requests.load(Ordering::SeqCst)
    }
}

impl Drop for Imds {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_one(mut conn: TcpStream, s: &Switches, i: &Mutex<Instance>) -> std::io::Result<()> {
    if s.down.load(Ordering::SeqCst) {
        return Ok(()); // dropped: the client sees the connection closed
    }
    let mut raw = Vec::new();
    let mut buf = [0u8; 1024];
    while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&raw).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let header = |name: &str| {
        head.split("\r\n").find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let (status, body) = if path == "/latest/api/token" {
        s.token_requests.fetch_add(1, Ordering::SeqCst);
        if s.hang_token.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        if method != "PUT" {
            (405, String::new())
        } else if header("x-aws-ec2-metadata-token-ttl-seconds").is_none() {
            (400, String::new())
        } else {
            (200, TOKEN.to_string())
        }
    } else if let Some(item) = path.strip_prefix("/latest/meta-data/") {
        s.metadata_requests.fetch_add(1, Ordering::SeqCst);
        s.asked.lock().expect("asked").push(item.to_string());
        let token = header("x-aws-ec2-metadata-token");
        if token.is_none() {
            s.tokenless_requests.fetch_add(1, Ordering::SeqCst);
        }
        let delay = s.metadata_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if token.as_deref() != Some(TOKEN) && !s.allow_v1.load(Ordering::SeqCst) {
            (401, String::new())
        } else {
            let inst = i.lock().expect("instance").clone();
            let macs = inst
                .macs
                .iter()
                .map(|m| format!("{m}/\n"))
                .collect::<String>();
            match item {
                "instance-id" => (200, inst.instance_id),
                "instance-type" => (200, inst.instance_type),
                "placement/availability-zone" => (200, inst.zone),
                "placement/region" => (200, inst.region),
                "network/interfaces/macs/" => (200, macs),
                "outpost-arn" => match inst.outpost_arn {
                    Some(arn) => (200, arn),
                    None => (404, String::new()),
                },
                _ => (404, String::new()),
            }
        }
    } else {
        (404, String::new())
    };
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        _ => "Error",
    };
    let resp = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(resp.as_bytes()).await?;
    conn.shutdown().await
}

/// A raw GET of `path` with no token, for checking the emulator enforces IMDSv2.
pub async fn raw_get_status(port: u16, path: &str) -> u16 {
    let mut c = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    c.read_to_string(&mut out).await.expect("read");
    out.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}
