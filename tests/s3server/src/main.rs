//! trainio-s3server: an S3 server over a directory for the object-storage tests.
//!
//! The S3 API is s3s's (SigV4, multipart uploads, ranged GETs) over s3s-fs's `FileSystem`
//! backend, where a bucket is a directory of the root and an object a file. What this
//! binary adds is the accept loop: every accepted connection gets TCP_NODELAY, as MinIO
//! (Go's default) and AWS do. Without it, a response body written in short pieces waits
//! for the client's ACK of the previous piece, and a client that delays its ACKs (boto3,
//! like most clients) loses ~40 ms on many GETs: a stall of the test server that no
//! production server has.
//!
//! Two options make a test's store what the test needs:
//! - `--egress-mib-s RATE`: response bodies leave at RATE MiB/s at most, shared by every
//!   connection in the order their pieces are ready, as through one link of that bandwidth.
//!   A job reading from the server becomes storage-bound with a compute small enough.
//! - `--nagle`: leaves Nagle's algorithm on (as s3s-fs's own binary does), for a bench that
//!   shows what it costs a client.
//!
//! Usage: trainio-s3server [--host H] [--port P] [--access-key K --secret-key S]
//!        [--domain D]... [--egress-mib-s RATE] [--nagle] ROOT
//! It prints `listening on http://ADDR` once it accepts connections, and stops on SIGTERM
//! or SIGINT (open connections get up to 5 s to finish).

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::Service;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use s3s::auth::SimpleAuth;
use s3s::host::MultiDomain;
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{HttpError, StdError};
use s3s_fs::FileSystem;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Sleep;

const USAGE: &str = "usage: trainio-s3server [--host H] [--port P] [--access-key K --secret-key S] [--domain D]... \
                     [--egress-mib-s RATE] [--nagle] ROOT";

#[derive(Debug, PartialEq)]
struct Options {
    host: String,
    port: u16,
    keys: Option<(String, String)>,
    domains: Vec<String>,
    egress_mib_s: Option<f64>,
    nagle: bool,
    root: PathBuf,
}

/// The options, or the one line that says which one is wrong and why.
fn parse(args: &[String]) -> Result<Options, String> {
    let mut host = "127.0.0.1".to_string();
    let mut port = 8014u16;
    let (mut access, mut secret) = (None, None);
    let mut domains = Vec::new();
    let mut egress_mib_s = None;
    let mut nagle = false;
    let mut root = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if !name.starts_with("--") {
            if root.replace(PathBuf::from(arg)).is_some() {
                return Err(format!("one root directory, not also {arg:?}"));
            }
            continue;
        }
        if name == "--help" {
            return Err(USAGE.to_string());
        }
        if name == "--nagle" {
            nagle = true;
            continue;
        }
        if !["--host", "--port", "--access-key", "--secret-key", "--domain", "--egress-mib-s"].contains(&name) {
            return Err(format!("unknown option {name}; {USAGE}"));
        }
        let value = match inline {
            Some(v) => v,
            None => it.next().cloned().ok_or_else(|| format!("{name} needs a value"))?,
        };
        match name {
            "--host" => host = value,
            "--port" => port = value.parse().map_err(|_| format!("--port {value:?}: not a port number (0-65535)"))?,
            "--access-key" => access = Some(value),
            "--secret-key" => secret = Some(value),
            "--domain" => {
                if value.contains('/') {
                    return Err(format!("--domain {value:?}: a domain name (with an optional :PORT), not a URL"));
                }
                domains.push(value);
            }
            "--egress-mib-s" => match value.parse::<f64>() {
                Ok(r) if r.is_finite() && r > 0.0 => egress_mib_s = Some(r),
                _ => return Err(format!("--egress-mib-s {value:?}: not a rate above 0 (MiB/s)")),
            },
            _ => unreachable!("{name} is one of the options above"),
        }
    }
    let keys = match (access, secret) {
        (Some(a), Some(s)) => Some((a, s)),
        (None, None) => None,
        _ => return Err("--access-key and --secret-key go together".to_string()),
    };
    let root = root.ok_or_else(|| format!("the root directory is missing; {USAGE}"))?;
    if !root.is_dir() {
        return Err(format!("{}: not a directory", root.display()));
    }
    Ok(Options { host, port, keys, domains, egress_mib_s, nagle, root })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("trainio-s3server: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("trainio-s3server: tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(serve(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trainio-s3server: {e}");
            ExitCode::from(1)
        }
    }
}

async fn serve(opts: Options) -> Result<(), String> {
    let root = opts.root.display().to_string();
    let fs = FileSystem::new(&opts.root).map_err(|e| format!("{root}: {e:?}"))?;
    let mut builder = S3ServiceBuilder::new(fs);
    if let Some((access, secret)) = opts.keys {
        builder.set_auth(SimpleAuth::from_single(access, secret));
    }
    if !opts.domains.is_empty() {
        let host = MultiDomain::new(&opts.domains).map_err(|e| format!("--domain {:?}: {e}", opts.domains))?;
        builder.set_host(host);
    }
    let link = opts.egress_mib_s.map(|r| Arc::new(Link::new(r)));
    let service = Shaped { s3: builder.build(), link };

    let listener = TcpListener::bind((opts.host.as_str(), opts.port))
        .await
        .map_err(|e| format!("listen on {}:{}: {e}", opts.host, opts.port))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on http://{addr}");

    let http = Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    loop {
        let socket = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                // EMFILE and the like: this connection is lost, the server goes on.
                Err(e) => {
                    eprintln!("trainio-s3server: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        // The point of this binary: the response's pieces leave as they are written,
        // without waiting for the client's ACK of the previous one.
        if let Err(e) = socket.set_nodelay(!opts.nagle) {
            eprintln!("trainio-s3server: TCP_NODELAY: {e}");
        }
        let conn = http.serve_connection(TokioIo::new(socket), service.clone()).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(Duration::from_secs(5)) => {}
    }
    Ok(())
}

/// One link's bandwidth, shared by every response body: each piece reserves the link for
/// its length at the rate, after the pieces reserved before it, and leaves when its
/// reservation ends. The reservations are on a clock of their own, so a timer that wakes
/// late delays one piece, not the rate: the pieces due meanwhile leave at once.
struct Link {
    ns_per_byte: f64,
    free_at: Mutex<Instant>,
}

impl Link {
    fn new(mib_s: f64) -> Self {
        Self { ns_per_byte: 1e9 / (mib_s * 1048576.0), free_at: Mutex::new(Instant::now()) }
    }

    /// When `n` bytes reserved now have passed the link.
    fn reserve(&self, n: usize) -> Instant {
        let mut free_at = self.free_at.lock().unwrap_or_else(|e| e.into_inner());
        let start = (*free_at).max(Instant::now());
        *free_at = start + Duration::from_nanos((n as f64 * self.ns_per_byte) as u64);
        *free_at
    }
}

/// The S3 service with its response bodies through the link, when there is one.
#[derive(Clone)]
struct Shaped {
    s3: S3Service,
    link: Option<Arc<Link>>,
}

impl Service<Request<Incoming>> for Shaped {
    type Response = Response<ShapedBody>;
    type Error = HttpError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, HttpError>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let response = Service::call(&self.s3, req);
        let link = self.link.clone();
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| ShapedBody { inner: Box::pin(inner), link, held: None }))
        })
    }
}

/// A response body whose data frames leave when the link has passed them.
struct ShapedBody {
    inner: Pin<Box<s3s::Body>>,
    link: Option<Arc<Link>>,
    /// A frame waiting for its reservation to end.
    held: Option<(Frame<Bytes>, Pin<Box<Sleep>>)>,
}

impl http_body::Body for ShapedBody {
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        let this = self.get_mut();
        if this.held.is_none() {
            let frame = match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(f)) => f,
                other => return Poll::Ready(other),
            };
            let (Some(link), Some(data)) = (&this.link, frame.data_ref()) else {
                return Poll::Ready(Some(Ok(frame)));
            };
            let due = link.reserve(data.len());
            if due <= Instant::now() {
                return Poll::Ready(Some(Ok(frame)));
            }
            this.held = Some((frame, Box::pin(tokio::time::sleep_until(due.into()))));
        }
        let (_, wait) = this.held.as_mut().expect("a held frame");
        ready!(wait.as_mut().poll(cx));
        Poll::Ready(this.held.take().map(|(frame, _)| Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.held.as_ref().and_then(|(f, _)| f.data_ref()).map_or(0, |d| d.len() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn takes_every_option_the_fixtures_pass() {
        let o = parse(&args("--host 127.0.0.1 --port 9000 --access-key a --secret-key b --domain s3.x.test:9000 /"))
            .unwrap();
        assert_eq!(o.port, 9000);
        assert_eq!(o.keys, Some(("a".into(), "b".into())));
        assert_eq!(o.domains, vec!["s3.x.test:9000".to_string()]);
        assert_eq!(o.root, PathBuf::from("/"));
        assert_eq!((o.egress_mib_s, o.nagle), (None, false));
        let o = parse(&args("--egress-mib-s=12.5 --nagle /")).unwrap();
        assert_eq!((o.egress_mib_s, o.nagle), (Some(12.5), true));
    }

    #[test]
    fn bad_options_name_what_is_wrong() {
        assert!(parse(&args("--port 70000 /")).unwrap_err().contains("--port"));
        assert!(parse(&args("--access-key a /")).unwrap_err().contains("--secret-key"));
        assert!(parse(&args("--domain http://x /")).unwrap_err().contains("--domain"));
        assert!(parse(&args("--bogus 1 /")).unwrap_err().contains("--bogus"));
        assert!(parse(&args("/nonexistent-trainio-root")).unwrap_err().contains("not a directory"));
        assert!(parse(&args("--port 1")).unwrap_err().contains("root"));
        assert!(parse(&args("--egress-mib-s 0 /")).unwrap_err().contains("--egress-mib-s"));
        assert!(parse(&args("--egress-mib-s nan /")).unwrap_err().contains("--egress-mib-s"));
    }

    #[test]
    fn the_link_passes_its_rate_and_no_more() {
        // 1 MiB/s: 64 KiB reserved back to back end 1/16 s after the first started.
        let link = Link::new(1.0);
        let t0 = Instant::now();
        let first = link.reserve(4096);
        let mut last = first;
        for _ in 1..16 {
            last = link.reserve(4096);
        }
        let span = last.duration_since(t0).as_secs_f64();
        assert!((0.0625..0.0625 + 0.01).contains(&span), "{span}");
        assert!(first.duration_since(t0).as_secs_f64() >= 4096.0 / 1048576.0);
    }
}
