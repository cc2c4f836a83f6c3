//! Just enough of the W3C WebDriver protocol to drive Debian's
//! `chromedriver`: a session, navigation, finding, clicking and typing,
//! text and attributes, cookies, screenshots. JSON over HTTP/1.1 on
//! loopback; each command is one connection.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::eventually;

/// The key WebDriver names an element by in its JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The Enter key, for `send_keys`.
pub const ENTER: &str = "\u{E007}";

/// A `chromedriver` process on a port of its own, killed when dropped.
pub struct ChromeDriver {
    child: tokio::process::Child,
    pub addr: String,
}

impl ChromeDriver {
    /// Starts `chromedriver` (`ACEMQ_CHROMEDRIVER`, default
    /// `chromedriver` on PATH) and waits until it answers `/status`.
    pub async fn start() -> ChromeDriver {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let bin = std::env::var("ACEMQ_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let child = tokio::process::Command::new(&bin)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{bin} does not start ({e}): apt-get install chromium chromium-driver")
            });
        let addr = format!("127.0.0.1:{port}");
        let up = eventually(Duration::from_secs(20), || async {
            command(&addr, "GET", "/status", None)
                .await
                .is_ok_and(|v| v["ready"] == json!(true))
        })
        .await;
        assert!(up, "chromedriver did not answer on {addr}");
        ChromeDriver { child, addr }
    }

    /// A new headless Chromium session: a fresh profile, no sandbox (CI
    /// runs as root), nothing fetched from the network by the browser itself.
    pub async fn session(&self, profile: &Path) -> Browser {
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--no-first-run".to_owned(),
            "--window-size=1280,900".to_owned(),
            format!("--user-data-dir={}", profile.display()),
        ];
        let mut chrome = json!({ "args": args });
        if let Ok(bin) = std::env::var("ACEMQ_CHROMIUM") {
            chrome["binary"] = json!(bin);
        }
        let caps = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": chrome,
            }}
        });
        let v = command(&self.addr, "POST", "/session", Some(caps))
            .await
            .unwrap_or_else(|e| panic!("no browser session: {e}"));
        let id = v["sessionId"].as_str().expect("a session id").to_owned();
        Browser {
            addr: self.addr.clone(),
            base: format!("/session/{id}"),
        }
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// One WebDriver command: its `value`, or the driver's error.
async fn command(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    // The head, then as many bytes as its Content-Length says.
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let (head_end, length) = loop {
        let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!(
                "connection closed: {}",
                String::from_utf8_lossy(&buf)
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| format!("no Content-Length: {head}"))?;
            break (i + 4, length);
        }
    };
    while buf.len() < head_end + length {
        let n = s.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let json = String::from_utf8_lossy(&buf[head_end..]);
    let v: Value = serde_json::from_str(&json).map_err(|e| format!("{e}: {json}"))?;
    let value = v["value"].clone();
    if value.get("error").is_some() {
        return Err(format!("{}: {}", value["error"], value["message"]));
    }
    Ok(if value.is_null() { v } else { value })
}

/// A browser session.
pub struct Browser {
    addr: String,
    base: String,
}

/// An element of the current page.
#[derive(Clone)]
pub struct Element(String);

impl Browser {
    async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        command(&self.addr, method, &format!("{}{path}", self.base), body).await
    }

    pub async fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url })))
            .await
            .unwrap_or_else(|e| panic!("goto {url}: {e}"));
    }

    pub async fn url(&self) -> String {
        self.cmd("GET", "/url", None)
            .await
            .expect("url")
            .as_str()
            .map(str::to_owned)
            .unwrap_or_default()
    }

    pub async fn source(&self) -> String {
        let v = self.cmd("GET", "/source", None).await.expect("source");
        v.as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| v["value"].to_string())
    }

    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        let body = json!({ "using": "css selector", "value": css });
        let v = self
            .cmd("POST", "/elements", Some(body))
            .await
            .expect("elements");
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(|s| Element(s.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The first element matching `css`, waited for (10 s at most).
    pub async fn find(&self, css: &str) -> Element {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(e) = self.find_all(css).await.into_iter().next() {
                return e;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "no element {css} on {}:\n{}",
                    self.url().await,
                    self.source().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn click(&self, e: &Element) {
        self.cmd("POST", &format!("/element/{}/click", e.0), Some(json!({})))
            .await
            .expect("click");
    }

    pub async fn send_keys(&self, e: &Element, text: &str) {
        self.cmd(
            "POST",
            &format!("/element/{}/value", e.0),
            Some(json!({ "text": text })),
        )
        .await
        .expect("send keys");
    }

    pub async fn text(&self, e: &Element) -> String {
        let v = self
            .cmd("GET", &format!("/element/{}/text", e.0), None)
            .await
            .expect("text");
        v.as_str().unwrap_or_default().to_owned()
    }

    pub async fn attr(&self, e: &Element, name: &str) -> Option<String> {
        let v = self
            .cmd("GET", &format!("/element/{}/attribute/{name}", e.0), None)
            .await
            .expect("attribute");
        v.as_str().map(str::to_owned)
    }

    /// The element that has the keyboard focus.
    pub async fn active(&self) -> Element {
        let v = self
            .cmd("GET", "/element/active", None)
            .await
            .expect("active");
        Element(v[ELEMENT].as_str().expect("an element").to_owned())
    }

    pub async fn delete_cookies(&self) {
        self.cmd("DELETE", "/cookie", None).await.expect("cookies");
    }

    /// The cookies the browser holds for the page, as WebDriver shows them.
    pub async fn cookies(&self) -> Vec<Value> {
        let v = self.cmd("GET", "/cookie", None).await.expect("cookies");
        v.as_array().cloned().unwrap_or_default()
    }

    /// Runs `script` in the page (WebDriver's synchronous execute) and
    /// returns what it returned.
    pub async fn execute(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
        .unwrap_or_else(|e| panic!("execute {script}: {e}"))
    }

    /// Sets the browser window's outer size in CSS pixels.
    pub async fn set_window(&self, width: u32, height: u32) {
        self.cmd(
            "POST",
            "/window/rect",
            Some(json!({ "width": width, "height": height })),
        )
        .await
        .expect("window rect");
    }

    /// A PNG of the viewport, written to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let v = self
            .cmd("GET", "/screenshot", None)
            .await
            .expect("screenshot");
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("base64"))
            .expect("a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot dir");
        }
        std::fs::write(path, png).expect("write the screenshot");
    }

    pub async fn quit(self) {
        let _ = self.cmd("DELETE", "", None).await;
        std::mem::forget(self);
    }
}

impl Drop for Browser {
    /// A test that fails before [`Browser::quit`] still ends its session,
    /// so chromedriver closes its Chromium (killing chromedriver alone
    /// would leave it running): one blocking `DELETE /session/{id}`.
    fn drop(&mut self) {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(&self.addr) else {
            return;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let req = format!(
            "DELETE {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            self.base, self.addr
        );
        if s.write_all(req.as_bytes()).is_ok() {
            let _ = s.read(&mut [0u8; 1024]);
        }
    }
}

impl std::fmt::Debug for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Element({})", self.0)
    }
}
