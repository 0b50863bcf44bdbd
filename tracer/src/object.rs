//! The object layer: HTTP/1.x object requests (S3 over plain HTTP) rebuilt from the traced
//! processes' sends and receives on TCP sockets.
//!
//! The kernel side (file.bpf.c, `exit_http`) copies at most `TRAINIO_HTTP_CAP` first bytes
//! of a send or receive only when they start a request or response head, and otherwise
//! reports the byte count alone: heads are parsed here, where a parser is plain Rust and
//! costs the traced process nothing, while the kernel does one 8-byte read per socket
//! syscall to decide. Each connection (socket inode) carries its requests in order, as
//! HTTP/1.1 keep-alive does: a request is issued at the entry of the send that carries its
//! head, has its first byte at the exit of the receive that returns its final (non-1xx)
//! response head, and completes at the exit of the receive that brings its body to the
//! response's Content-Length (at the head for HEAD, 204 and 304). A chunked response, a
//! connection closed early and a request still open when the recording ends are written
//! as incomplete (`error` = -ENODATA) with the bytes seen.
//!
//! The requests outstanding per endpoint at each issue (the object store's queue depth)
//! are counted when a request is written, from the issue and completion times of the
//! endpoint's requests, not in the order the syscalls' records arrive: two threads'
//! sends can exit in the other order than they entered.
use std::collections::VecDeque;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use rustc_hash::FxHashMap;

/// `error` of a request whose response was not received in full.
pub const INCOMPLETE: i32 = -libc::ENODATA;
const AF_INET: u16 = 2;
#[cfg(test)]
const AF_INET6: u16 = 10;
/// Bytes the kernel copies of a head at most (TRAINIO_HTTP_CAP in bpf/trainio.h).
const CAPTURE: usize = 2048;
/// Set in the connection key of a socket's TLS plaintext: the socket's own sends and
/// receives (ciphertext) never reach that connection's requests (inode numbers stay far
/// below this bit).
const TLS_CONN: u64 = 1 << 63;
/// How long a finished request is kept to count it in later-drained issues' depth.
const DEPTH_HORIZON_NS: i64 = 1_000_000_000;

/// One send or receive on a TCP socket, as the kernel reported it.
pub struct SocketIo<'a> {
    pub write: bool,
    pub enter_ns: i64,
    pub exit_ns: i64,
    pub ret: i64,
    pub ino: u64,
    pub pid: u32,
    pub tid: u32,
    pub fd: i32,
    pub comm: &'a str,
    pub family: u16,
    pub daddr: [u8; 16],
    /// Network byte order, as the socket holds it.
    pub dport: u16,
    /// The syscall's first bytes when they start an HTTP head; empty otherwise.
    pub head: &'a [u8],
    /// A TLS library call's plaintext over the socket `ino` (bpf/file_tls.bpf.h), not a
    /// syscall: its connection is kept apart from the socket's own (ciphertext) bytes.
    pub tls: bool,
}

/// A finished request: one object-layer row.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectRequest {
    pub op: &'static str,
    pub issue_ns: i64,
    pub complete_ns: i64,
    pub first_byte_ns: Option<i64>,
    pub offset: Option<i64>,
    pub bytes: i64,
    pub bytes_requested: i64,
    pub queue_depth: u32,
    pub pid: u32,
    pub tid: u32,
    pub fd: i32,
    pub comm: Box<str>,
    /// `bucket/key`: the path, decoded, without its query, after the bucket a
    /// virtual-hosted request names in its host (virtual_host_bucket).
    pub key: Box<str>,
    pub endpoint: Arc<str>,
    pub http_status: Option<u32>,
    pub error: i32,
}

#[derive(Debug)]
struct Request {
    id: u64,
    op: &'static str,
    issue_ns: i64,
    last_ns: i64,
    pid: u32,
    tid: u32,
    fd: i32,
    comm: Box<str>,
    key: Box<str>,
    range: Option<Range>,
    request_length: Option<i64>,
    body_sent: i64,
    status: Option<u32>,
    first_byte_ns: Option<i64>,
    /// The response's Content-Length; None: unknown (chunked, or not said).
    response_length: Option<i64>,
    chunked: bool,
    /// The final response head has arrived.
    head_done: bool,
    body_received: i64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Range {
    /// `bytes=first-last` (last None: to the end).
    From(i64, Option<i64>),
    /// `bytes=-n`: the last n bytes.
    Suffix(i64),
}

struct Conn {
    endpoint: Arc<str>,
    requests: VecDeque<Request>,
}

#[derive(Default)]
struct Endpoint {
    /// Requests issued and not finished: id → issue_ns.
    open: FxHashMap<u64, i64>,
    /// (issue_ns, complete_ns) of finished requests, kept while a later-drained request
    /// may have been issued before they completed.
    done: Vec<(i64, i64)>,
}

#[derive(Default)]
pub struct ObjectTracker {
    conns: FxHashMap<u64, Conn>,
    endpoints: FxHashMap<Arc<str>, Endpoint>,
    names: FxHashMap<([u8; 16], u16, u16), Arc<str>>,
    next_id: u64,
    latest_issue_ns: i64,
}

fn endpoint_name(family: u16, daddr: &[u8; 16], dport: u16) -> String {
    let port = u16::from_be(dport);
    if family == AF_INET {
        return format!("{}:{port}", Ipv4Addr::new(daddr[0], daddr[1], daddr[2], daddr[3]));
    }
    let v6 = Ipv6Addr::from(*daddr);
    match v6.to_ipv4_mapped() {
        Some(v4) => format!("{v4}:{port}"),
        None => format!("[{v6}]:{port}"),
    }
}

fn method_op(method: &str) -> &'static str {
    match method {
        "GET" => "get",
        "PUT" => "put",
        "HEAD" => "head",
        "POST" => "post",
        "DELETE" => "delete",
        _ => "other",
    }
}

/// A head's lines (up to the blank line) and its length in bytes; None when the blank
/// line is not within `data`.
fn split_head(data: &[u8]) -> Option<(Vec<&str>, usize)> {
    let end = data.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = std::str::from_utf8(&data[..end - 4]).ok()?;
    Some((text.split("\r\n").collect(), end))
}

fn header<'a>(lines: &[&'a str], name: &str) -> Option<&'a str> {
    lines.iter().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_range(v: &str) -> Option<Range> {
    let spec = v.strip_prefix("bytes=")?.split(',').next()?.trim();
    let (a, b) = spec.split_once('-')?;
    if a.is_empty() {
        return b.parse().ok().map(Range::Suffix);
    }
    let first: i64 = a.parse().ok()?;
    let last = if b.is_empty() { None } else { Some(b.parse().ok()?) };
    Some(Range::From(first, last))
}

/// The parts of a request head: method, key, Range, Content-Length, head length.
type RequestHead = (String, String, Option<Range>, Option<i64>, usize);

/// The complete lines of a head cut short by the kernel's copy (`CAPTURE` bytes): a head
/// longer than that is known by its request line and the headers within the copy, and
/// its length is taken as the whole send (usize::MAX: no body bytes in it).
fn cut_head(data: &[u8]) -> Option<(Vec<&str>, usize)> {
    if data.len() < CAPTURE {
        return None;
    }
    let end = data.windows(2).rposition(|w| w == b"\r\n")?;
    let text = std::str::from_utf8(&data[..end]).ok()?;
    Some((text.split("\r\n").collect(), usize::MAX))
}

/// The bucket a virtual-hosted request names in its host (`B.s3.amazonaws.com`,
/// `B.s3.REGION.amazonaws.com`, `B.s3-REGION.amazonaws.com`, `B.s3.example.org:9000`): the
/// labels before the first label, past the host's first, that is `s3` or starts with
/// `s3-` or `s3express-`. None for an IP address and for a name without such a label (a
/// path-style request: the bucket is the path's first segment). The server's own domain
/// is not known here, so a virtual-hosted name without an `s3` label (`B.minio.lab:9000`)
/// is taken for path-style.
fn virtual_host_bucket(authority: &str) -> Option<&str> {
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.starts_with('[') {
        return None; // an IPv6 literal
    }
    let host = host.split_once(':').map_or(host, |(h, _)| h).trim_end_matches('.');
    if host.parse::<Ipv4Addr>().is_ok() {
        return None;
    }
    let service = |label: &str| {
        let l = label.to_ascii_lowercase();
        l == "s3" || l.starts_with("s3-") || l.starts_with("s3express-")
    };
    let mut at = 0;
    for (i, label) in host.split('.').enumerate() {
        if i > 0 && service(label) {
            return Some(&host[..at - 1]).filter(|b| !b.is_empty());
        }
        at += label.len() + 1;
    }
    None
}

fn parse_request(data: &[u8]) -> Option<RequestHead> {
    let (lines, len) = split_head(data).or_else(|| cut_head(data))?;
    let mut parts = lines.first()?.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    // An absolute-form target (through a proxy) names the host first, before any Host.
    let (authority, path) = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or((rest, "/"), |i| (&rest[..i], &rest[i..])),
        None => (header(&lines, "host").unwrap_or(""), target),
    };
    let path = path.split('?').next().unwrap_or("");
    let key = percent_decode(path.trim_start_matches('/'));
    let key = match virtual_host_bucket(authority) {
        Some(bucket) if key.is_empty() => bucket.to_string(),
        Some(bucket) => format!("{bucket}/{key}"),
        None => key,
    };
    let range = header(&lines, "range").and_then(parse_range);
    let length = header(&lines, "content-length").and_then(|v| v.parse().ok());
    Some((method.to_string(), key, range, length, len))
}

/// A response head: status, Content-Length, chunked, head length.
fn parse_response(data: &[u8]) -> Option<(u32, Option<i64>, bool, usize)> {
    let (lines, len) = split_head(data)?;
    let mut parts = lines.first()?.split(' ');
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let status = parts.next()?.parse().ok()?;
    let length = header(&lines, "content-length").and_then(|v| v.parse().ok());
    let chunked = header(&lines, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    Some((status, length, chunked, len))
}

impl Request {
    /// A response with no body: to HEAD, and 204 and 304 (RFC 9112 §6.3).
    fn bodiless(&self) -> bool {
        self.op == "head" || matches!(self.status, Some(204 | 304))
    }

    fn complete(&self) -> bool {
        self.head_done && (self.bodiless() || self.response_length.is_some_and(|l| self.body_received >= l))
    }

    /// Body bytes sent for a put or post, received otherwise.
    fn sends_body(&self) -> bool {
        matches!(self.op, "put" | "post")
    }
}

impl ObjectTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one send or receive; finished requests are appended to `out`.
    pub fn on_io(&mut self, io: &SocketIo, out: &mut Vec<ObjectRequest>) {
        let conn = if io.tls { io.ino | TLS_CONN } else { io.ino };
        if io.ret < 0 {
            if io.ret == -(libc::EAGAIN as i64) || io.ret == -(libc::EINTR as i64) {
                return;
            }
            self.close_socket(conn, io.exit_ns, io.ret as i32, out);
            return;
        }
        if io.write {
            self.on_send(conn, io, out);
        } else if io.ret == 0 {
            self.close_socket(conn, io.exit_ns, INCOMPLETE, out);
        } else {
            self.on_receive(conn, io, out);
        }
    }

    /// The peer closed (error: INCOMPLETE) or the socket failed: the connection's requests
    /// are written, and so are those of the TLS connection over the socket.
    fn close_socket(&mut self, conn: u64, ns: i64, error: i32, out: &mut Vec<ObjectRequest>) {
        for key in [conn, conn | TLS_CONN] {
            if error == INCOMPLETE {
                // A body that runs to the close (no length, not chunked) is whole.
                if let Some(r) = self.conns.get_mut(&key).and_then(|c| c.requests.front_mut()) {
                    if r.head_done && r.response_length.is_none() && !r.chunked {
                        r.response_length = Some(r.body_received);
                    }
                }
            }
            self.close(key, ns, error, out);
        }
    }

    fn on_send(&mut self, conn_key: u64, io: &SocketIo, out: &mut Vec<ObjectRequest>) {
        if let Some((method, key, range, length, head_len)) = parse_request(io.head) {
            // A request still waiting for the rest of an answered response was abandoned
            // (or its chunked body ended unseen): written as incomplete.
            while let Some(c) = self.conns.get(&conn_key) {
                if !c.requests.front().is_some_and(|r| r.head_done) {
                    break;
                }
                self.finish_front(conn_key, io.enter_ns, INCOMPLETE, out);
            }
            let endpoint = self
                .names
                .entry((io.daddr, io.dport, io.family))
                .or_insert_with(|| endpoint_name(io.family, &io.daddr, io.dport).into())
                .clone();
            let id = self.next_id;
            self.next_id += 1;
            self.latest_issue_ns = self.latest_issue_ns.max(io.enter_ns);
            self.endpoints.entry(endpoint.clone()).or_default().open.insert(id, io.enter_ns);
            let conn = self
                .conns
                .entry(conn_key)
                .or_insert_with(|| Conn { endpoint: endpoint.clone(), requests: VecDeque::new() });
            conn.endpoint = endpoint;
            conn.requests.push_back(Request {
                id,
                op: method_op(&method),
                issue_ns: io.enter_ns,
                last_ns: io.exit_ns,
                pid: io.pid,
                tid: io.tid,
                fd: io.fd,
                comm: io.comm.into(),
                key: key.into(),
                range,
                request_length: length,
                body_sent: io.ret.saturating_sub(i64::try_from(head_len).unwrap_or(i64::MAX)).max(0),
                status: None,
                first_byte_ns: None,
                response_length: None,
                chunked: false,
                head_done: false,
                body_received: 0,
            });
            return;
        }
        // Not a head: the body of the connection's last request, if it has one to send.
        if let Some(r) = self.conns.get_mut(&conn_key).and_then(|c| c.requests.back_mut()) {
            if r.sends_body() && r.request_length.is_none_or(|l| r.body_sent < l) {
                r.body_sent += io.ret;
                r.last_ns = io.exit_ns;
            }
        }
    }

    fn on_receive(&mut self, conn_key: u64, io: &SocketIo, out: &mut Vec<ObjectRequest>) {
        let Some(r) = self.conns.get_mut(&conn_key).and_then(|c| c.requests.front_mut()) else { return };
        r.last_ns = io.exit_ns;
        if r.head_done {
            r.body_received += io.ret;
        } else {
            // Interim (1xx) heads, e.g. 100 Continue, then the final one.
            let mut at = 0usize;
            while let Some((status, length, chunked, len)) = io.head.get(at..).and_then(parse_response) {
                at += len;
                if (100..200).contains(&status) {
                    continue;
                }
                r.status = Some(status);
                r.first_byte_ns = Some(io.exit_ns);
                r.response_length = length;
                r.chunked = chunked;
                r.head_done = true;
                r.body_received = (io.ret - at as i64).max(0);
                break;
            }
        }
        if r.complete() {
            self.finish_front(conn_key, io.exit_ns, 0, out);
        }
    }

    /// The connection ended or failed: its requests are written with `error` unless whole.
    fn close(&mut self, ino: u64, ns: i64, error: i32, out: &mut Vec<ObjectRequest>) {
        while self.conns.get(&ino).is_some_and(|c| !c.requests.is_empty()) {
            let whole = self.conns[&ino].requests.front().is_some_and(Request::complete);
            self.finish_front(ino, ns, if whole { 0 } else { error }, out);
        }
        self.conns.remove(&ino);
    }

    /// Every request still open (the recording ends): written as incomplete.
    pub fn finish_all(&mut self, out: &mut Vec<ObjectRequest>) {
        let inos: Vec<u64> = self.conns.keys().copied().collect();
        for ino in inos {
            let last = self.conns[&ino].requests.iter().map(|r| r.last_ns).max().unwrap_or(0);
            self.close(ino, last, INCOMPLETE, out);
        }
    }

    fn finish_front(&mut self, ino: u64, ns: i64, error: i32, out: &mut Vec<ObjectRequest>) {
        let Some(conn) = self.conns.get_mut(&ino) else { return };
        let Some(r) = conn.requests.pop_front() else { return };
        let endpoint = conn.endpoint.clone();
        let complete_ns = if error == 0 { ns } else { r.last_ns }.max(r.issue_ns);
        let ep = self.endpoints.entry(endpoint.clone()).or_default();
        ep.open.remove(&r.id);
        let before = |issue: i64| issue < r.issue_ns;
        let open = ep.open.values().filter(|&&i| before(i)).count();
        let done = ep.done.iter().filter(|&&(i, c)| before(i) && c > r.issue_ns).count();
        ep.done.push((r.issue_ns, complete_ns));
        let horizon = ep.open.values().copied().chain([self.latest_issue_ns]).min().unwrap_or(0) - DEPTH_HORIZON_NS;
        ep.done.retain(|&(_, c)| c >= horizon);
        let moved = if r.sends_body() { r.body_sent } else { r.body_received };
        let (offset, requested) = match r.range {
            Some(Range::From(first, Some(last))) => (Some(first), last - first + 1),
            Some(Range::From(first, None)) => (Some(first), r.response_length.unwrap_or(0)),
            Some(Range::Suffix(n)) => (None, n),
            None if r.sends_body() => (None, r.request_length.unwrap_or(r.body_sent)),
            None => (None, r.response_length.unwrap_or(0)),
        };
        out.push(ObjectRequest {
            op: r.op,
            issue_ns: r.issue_ns,
            complete_ns,
            first_byte_ns: r.first_byte_ns,
            offset,
            bytes: moved,
            bytes_requested: requested,
            queue_depth: (1 + open + done) as u32,
            pid: r.pid,
            tid: r.tid,
            fd: r.fd,
            comm: r.comm,
            key: r.key,
            endpoint,
            http_status: r.status,
            error,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io<'a>(write: bool, ino: u64, t: (i64, i64), ret: i64, head: &'a [u8]) -> SocketIo<'a> {
        SocketIo {
            write,
            enter_ns: t.0,
            exit_ns: t.1,
            ret,
            ino,
            pid: 10,
            tid: 11,
            fd: 5,
            comm: "python",
            family: AF_INET,
            daddr: [127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            dport: 9000u16.to_be(),
            head,
            tls: false,
        }
    }

    const GET_RANGED: &[u8] =
        b"GET /bkt/dir/a%20b.npz?x-id=GetObject HTTP/1.1\r\nHost: h\r\nRange: bytes=100-149\r\n\r\n";
    const OK_206: &[u8] = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 50\r\n\r\n0123456789";

    #[test]
    fn a_ranged_get_over_two_receives_is_one_request() {
        let mut t = ObjectTracker::new();
        let mut out = Vec::new();
        t.on_io(&io(true, 1, (100, 110), GET_RANGED.len() as i64, GET_RANGED), &mut out);
        t.on_io(&io(false, 1, (120, 200), OK_206.len() as i64, OK_206), &mut out);
        assert!(out.is_empty(), "40 body bytes are still to come");
        t.on_io(&io(false, 1, (210, 300), 40, b""), &mut out);
        assert_eq!(out.len(), 1);
        let r = &out[0];
        assert_eq!(
            (r.op, &*r.key, r.offset, r.bytes_requested, r.bytes),
            ("get", "bkt/dir/a b.npz", Some(100), 50, 50)
        );
        assert_eq!((r.issue_ns, r.first_byte_ns, r.complete_ns), (100, Some(200), 300));
        assert_eq!((r.http_status, r.error, &*r.endpoint, r.queue_depth), (Some(206), 0, "127.0.0.1:9000", 1));
    }

    #[test]
    fn a_virtual_hosted_request_names_its_bucket_in_the_host() {
        let requests: [(&[u8], &str); 8] = [
            (b"GET /dir/a%20b.npz HTTP/1.1\r\nHost: train.s3.trainio.test:9000\r\n\r\n", "train/dir/a b.npz"),
            (b"GET /k HTTP/1.1\r\nhost: my.data.s3.us-west-2.amazonaws.com\r\n\r\n", "my.data/k"),
            (b"GET /k HTTP/1.1\r\nHost: b.s3-us-west-2.amazonaws.com\r\n\r\n", "b/k"),
            (b"GET /?list-type=2 HTTP/1.1\r\nHost: b.s3.amazonaws.com\r\n\r\n", "b"),
            (b"GET http://b.s3.amazonaws.com/k HTTP/1.1\r\nHost: proxy\r\n\r\n", "b/k"),
            // Path-style: the endpoint's own name, an address, or no s3 label after the first.
            (b"GET /bkt/k HTTP/1.1\r\nHost: s3.us-west-2.amazonaws.com\r\n\r\n", "bkt/k"),
            (b"GET /bkt/k HTTP/1.1\r\nHost: 127.0.0.1:9000\r\n\r\n", "bkt/k"),
            (b"GET /bkt/k HTTP/1.1\r\nHost: minio.lab.example:9000\r\n\r\n", "bkt/k"),
        ];
        for (head, key) in requests {
            let (_, got, ..) = parse_request(head).expect("a request head");
            assert_eq!(got, key, "{}", String::from_utf8_lossy(head));
        }
        assert_eq!(virtual_host_bucket("[::1]:9000"), None);
        assert_eq!(virtual_host_bucket("b.S3.example.org."), Some("b"));
        assert_eq!(virtual_host_bucket(".s3.example.org"), None);
    }

    #[test]
    fn keep_alive_requests_follow_each_other_and_a_head_has_no_body() {
        let mut t = ObjectTracker::new();
        let mut out = Vec::new();
        let head = b"HEAD /bkt/k HTTP/1.1\r\n\r\n";
        t.on_io(&io(true, 1, (0, 1), head.len() as i64, head), &mut out);
        let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n";
        t.on_io(&io(false, 1, (2, 3), resp.len() as i64, resp), &mut out);
        let get = b"GET /bkt/missing HTTP/1.1\r\n\r\n";
        t.on_io(&io(true, 1, (4, 5), get.len() as i64, get), &mut out);
        let nf = b"HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\n\r\nabc";
        t.on_io(&io(false, 1, (6, 7), nf.len() as i64, nf), &mut out);
        let got: Vec<_> = out.iter().map(|r| (r.op, r.http_status, r.bytes, r.bytes_requested, r.error)).collect();
        assert_eq!(got, [("head", Some(200), 0, 4096, 0), ("get", Some(404), 3, 3, 0)]);
    }

    #[test]
    fn a_put_counts_the_body_it_sends_after_100_continue() {
        let mut t = ObjectTracker::new();
        let mut out = Vec::new();
        let put = b"PUT /bkt/obj HTTP/1.1\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n";
        t.on_io(&io(true, 1, (0, 1), put.len() as i64, put), &mut out);
        let cont = b"HTTP/1.1 100 Continue\r\n\r\n";
        t.on_io(&io(false, 1, (2, 3), cont.len() as i64, cont), &mut out);
        t.on_io(&io(true, 1, (4, 5), 600, b""), &mut out);
        t.on_io(&io(true, 1, (6, 7), 400, b""), &mut out);
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        t.on_io(&io(false, 1, (8, 9), ok.len() as i64, ok), &mut out);
        assert_eq!(out.len(), 1);
        let r = &out[0];
        assert_eq!((r.op, r.bytes, r.bytes_requested, r.first_byte_ns, r.complete_ns), ("put", 1000, 1000, Some(9), 9));
    }

    #[test]
    fn chunked_and_cut_responses_are_incomplete() {
        let mut t = ObjectTracker::new();
        let mut out = Vec::new();
        let get = b"GET /bkt/a HTTP/1.1\r\n\r\n";
        t.on_io(&io(true, 1, (0, 1), get.len() as i64, get), &mut out);
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello";
        t.on_io(&io(false, 1, (2, 3), chunked.len() as i64, chunked), &mut out);
        // The next request on the connection ends the chunked one.
        t.on_io(&io(true, 1, (4, 5), get.len() as i64, get), &mut out);
        assert_eq!((out[0].error, out[0].complete_ns, out[0].http_status), (INCOMPLETE, 3, Some(200)));
        let short = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nxx";
        t.on_io(&io(false, 1, (6, 7), short.len() as i64, short), &mut out);
        t.on_io(&io(false, 1, (8, 9), 0, b""), &mut out);
        // Incomplete: it ends with the last bytes it moved, not with the close.
        assert_eq!((out[1].error, out[1].bytes, out[1].complete_ns), (INCOMPLETE, 2, 7));
        t.on_io(&io(true, 2, (10, 11), get.len() as i64, get), &mut out);
        t.finish_all(&mut out);
        assert_eq!((out[2].error, out[2].http_status, out[2].first_byte_ns), (INCOMPLETE, None, None));
    }

    #[test]
    fn depth_counts_the_endpoints_open_requests_whatever_order_they_drain_in() {
        let mut t = ObjectTracker::new();
        let mut out = Vec::new();
        let get = b"GET /bkt/a HTTP/1.1\r\n\r\n";
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx";
        // Connection 2's send entered first but exits (drains) second.
        t.on_io(&io(true, 1, (20, 30), get.len() as i64, get), &mut out);
        t.on_io(&io(true, 2, (10, 40), get.len() as i64, get), &mut out);
        t.on_io(&io(true, 3, (25, 41), get.len() as i64, get), &mut out);
        t.on_io(&io(false, 1, (50, 60), ok.len() as i64, ok), &mut out);
        t.on_io(&io(false, 3, (50, 70), ok.len() as i64, ok), &mut out);
        t.on_io(&io(false, 2, (50, 80), ok.len() as i64, ok), &mut out);
        // A request issued after all three completed.
        t.on_io(&io(true, 1, (90, 91), get.len() as i64, get), &mut out);
        t.on_io(&io(false, 1, (92, 93), ok.len() as i64, ok), &mut out);
        let got: Vec<_> = out.iter().map(|r| (r.issue_ns, r.queue_depth)).collect();
        assert_eq!(got, [(20, 2), (25, 3), (10, 1), (90, 1)]);
    }

    #[test]
    fn a_head_longer_than_the_copy_is_known_by_its_first_lines() {
        let mut t = ObjectTracker::new();
        let mut out = Vec::new();
        let mut head = b"GET /bkt/long HTTP/1.1\r\nRange: bytes=0-9\r\nX-Pad: ".to_vec();
        head.resize(CAPTURE, b'a');
        t.on_io(&io(true, 1, (0, 1), 3000, &head), &mut out);
        let ok = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\r\n0123456789";
        t.on_io(&io(false, 1, (2, 3), ok.len() as i64, ok), &mut out);
        let got: Vec<_> = out.iter().map(|r| (r.op, &*r.key, r.offset, r.bytes_requested, r.bytes)).collect();
        assert_eq!(got, [("get", "bkt/long", Some(0), 10, 10)]);
    }

    #[test]
    fn tls_plaintext_is_the_request_and_the_sockets_ciphertext_is_not_counted() {
        let mut t = ObjectTracker::new();
        let mut out = Vec::new();
        let tls = |io: SocketIo<'static>| SocketIo { tls: true, ..io };
        let get = b"GET /bkt/k HTTP/1.1\r\n\r\n";
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789";
        // The SSL_write call, then the ciphertext send made inside it.
        t.on_io(&tls(io(true, 7, (10, 40), get.len() as i64, get)), &mut out);
        t.on_io(&io(true, 7, (20, 30), 90, b""), &mut out);
        // Ciphertext receives: a record of the head and body (not counted), then the plaintext.
        t.on_io(&io(false, 7, (50, 60), 200, b""), &mut out);
        t.on_io(&tls(io(false, 7, (45, 70), ok.len() as i64, ok)), &mut out);
        t.on_io(&io(false, 7, (75, 80), 500, b""), &mut out);
        assert!(out.is_empty(), "90 body bytes are still to come in plaintext");
        t.on_io(&tls(io(false, 7, (72, 85), 90, b"")), &mut out);
        let got: Vec<_> =
            out.iter().map(|r| (r.op, &*r.key, r.bytes, r.issue_ns, r.first_byte_ns, r.complete_ns)).collect();
        assert_eq!(got, [("get", "bkt/k", 100, 10, Some(70), 85)]);
        // A TLS call that moved nothing (want read) is no receive; the socket's close ends
        // the TLS connection's open request.
        t.on_io(&tls(io(true, 7, (90, 95), get.len() as i64, get)), &mut out);
        t.on_io(&tls(io(false, 7, (96, 97), -(libc::EAGAIN as i64), b"")), &mut out);
        assert_eq!(out.len(), 1);
        t.on_io(&io(false, 7, (98, 99), 0, b""), &mut out);
        assert_eq!((out.len(), out[1].error, out[1].http_status), (2, INCOMPLETE, None));
    }

    #[test]
    fn endpoints_name_ipv4_ipv6_and_mapped_addresses() {
        let mut v6 = [0u8; 16];
        v6[15] = 1;
        assert_eq!(endpoint_name(AF_INET6, &v6, 443u16.to_be()), "[::1]:443");
        let mut mapped = [0u8; 16];
        mapped[10] = 0xff;
        mapped[11] = 0xff;
        mapped[12..].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(endpoint_name(AF_INET6, &mapped, 80u16.to_be()), "10.0.0.2:80");
        assert_eq!(parse_range("bytes=-500"), Some(Range::Suffix(500)));
        assert_eq!(parse_range("bytes=7-"), Some(Range::From(7, None)));
        assert_eq!(percent_decode("a%2Fb%zz%4"), "a/b%zz%4");
    }
}
