//! The /metrics endpoint: OpenMetrics text by default, Prometheus's protobuf (native
//! histograms) when the scraper's Accept header asks for it; with `--pprof`, the pprof
//! profile of the last intervals' sampled stacks at `/debug/pprof/mmaplock` (`?seconds=N`);
//! TLS and basic auth, for both, when a web configuration file says so (`webconfig.rs`).
//!
//! Any local user can connect, so the server holds up against idle and slow clients:
//! - a request's head must arrive within [`HEADER_TIMEOUT`], which also closes a kept-alive
//!   connection idle that long; a connection that moves no byte for [`IDLE_TIMEOUT`] (a
//!   client that does not read its response) is closed, and so is a TLS handshake that takes
//!   longer than [`HANDSHAKE_TIMEOUT`];
//! - at most [`max_connections`] are open at once: a new connection beyond it closes the
//!   connection quiet the longest (no byte for a second or more), or, if every one is busy,
//!   is closed at once. So idle connections never keep a scrape out, and the descriptors the
//!   kernel side needs (maps, links, the flush iterator's) are never taken by clients;
//! - accepting never fails the agent: out of descriptors, it waits and tries again.
//!
//! What was closed and why is counted in `mmaplock_http_rejected_total{reason}`.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    net::SocketAddr,
    pin::Pin,
    rc::Rc,
    sync::{Arc, RwLock},
    task::{Context, Poll},
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    time::Instant,
};

use crate::{
    agent::{endpoint::PPROF_PATH, profiles::SharedProfiles, webconfig::WebConfig},
    output::prometheus::{Shared, encode_protobuf, encode_text},
};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROTOBUF: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// A request's head must arrive within this (from the connection's start, or from the end
/// of the previous response on a kept-alive connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection that moves no byte for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A TLS handshake must be done within this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most connections open at once (Prometheus needs one or two).
pub const MAX_CONNECTIONS: usize = 256;
/// Descriptors kept for the kernel side and the registry: BPF maps, programs and links, the
/// rings' epoll, the flush iterator's link and descriptor at each reading, /proc files.
pub const RESERVED_FDS: u64 = 256;
/// A connection quiet this long may be closed for a new one when at the cap.
const EVICTABLE_AFTER: Duration = Duration::from_secs(1);

/// The connection cap under this process's open-file limit: never more than the limit
/// leaves after [`RESERVED_FDS`].
pub fn max_connections() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let room = soft.saturating_sub(RESERVED_FDS).max(8);
    MAX_CONNECTIONS.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// Does the scraper accept the protobuf exposition?
pub fn wants_protobuf(accept: &str) -> bool {
    accept.contains("application/vnd.google.protobuf")
        && accept.contains("io.prometheus.client.MetricFamily")
}

pub(super) fn plain(status: StatusCode, body: &'static [u8]) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body)));
    *r.status_mut() = status;
    r
}

/// What the server serves: the metrics, and with `--pprof` the profiles.
#[derive(Clone)]
pub struct Routes {
    pub registry: Arc<Registry>,
    pub profiles: Option<SharedProfiles>,
}

fn respond(routes: &Routes, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() == PPROF_PATH {
        return super::endpoint::pprof(routes.profiles.as_ref(), req);
    }
    if req.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, b"mmaplock-prof: see /metrics\n");
    }
    let registry = &routes.registry;
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (body, kind) = match wants_protobuf(accept).then(|| encode_protobuf(registry)) {
        Some(Some(bytes)) => (Bytes::from(bytes), PROTOBUF),
        _ => match encode_text(registry) {
            Ok(text) => (Bytes::from(text), OPENMETRICS),
            Err(_) => return plain(StatusCode::INTERNAL_SERVER_ERROR, b"encoding failed\n"),
        },
    };
    Response::builder()
        .header(header::CONTENT_TYPE, kind)
        .body(Full::new(body))
        .expect("valid headers")
}

/// Binds `addr` now (so that a bad or busy address is reported at start).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The web configuration in force (replaced on SIGHUP).
pub type Web = Arc<RwLock<Arc<WebConfig>>>;

/// Why a connection was closed by us, as counted.
#[derive(Clone, Copy)]
enum Rejected {
    Limit,
    Timeout,
    Tls,
    Unauthorized,
}

fn count(metrics: &Shared, why: Rejected) {
    if let Ok(mut m) = metrics.0.lock() {
        let h = &mut m.http;
        match why {
            Rejected::Limit => h.limit += 1,
            Rejected::Timeout => h.timeout += 1,
            Rejected::Tls => h.tls += 1,
            Rejected::Unauthorized => h.unauthorized += 1,
        }
    }
}

/// The open connections: when each last moved a byte, and how to close it.
#[derive(Default)]
struct Connections {
    next: u64,
    open: HashMap<u64, (Rc<Cell<Instant>>, tokio::task::AbortHandle)>,
}

/// Removes a connection from the table when its task ends (or is aborted).
struct Registered {
    id: u64,
    table: Rc<RefCell<Connections>>,
    metrics: Shared,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut t = self.table.borrow_mut();
        t.open.remove(&self.id);
        if let Ok(mut m) = self.metrics.0.lock() {
            m.http.open = t.open.len() as u64;
        }
    }
}

/// A stream that notes when it last moved a byte.
struct Watched<S> {
    inner: S,
    last: Rc<Cell<Instant>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.last.set(Instant::now());
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.last.set(Instant::now());
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Resolves when `last` is older than [`IDLE_TIMEOUT`].
async fn idle(last: Rc<Cell<Instant>>) {
    loop {
        let deadline = last.get() + IDLE_TIMEOUT;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// Serves one connection (TLS first if configured) until it ends or times out.
async fn connection(
    stream: tokio::net::TcpStream,
    last: Rc<Cell<Instant>>,
    routes: Routes,
    web: Web,
    metrics: Shared,
) {
    let config = web.read().map(|w| w.clone()).ok();
    let Some(config) = config else { return };
    let io = Watched {
        inner: stream,
        last: last.clone(),
    };
    let served = async {
        match config.tls.clone() {
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
                    Ok(Ok(s)) => http(s, routes, config, metrics.clone()).await,
                    Ok(Err(e)) => {
                        log::debug!("TLS handshake: {e}");
                        count(&metrics, Rejected::Tls);
                    }
                    Err(_) => count(&metrics, Rejected::Timeout),
                }
            }
            None => http(io, routes, config, metrics.clone()).await,
        }
    };
    tokio::select! {
        () = served => {}
        () = idle(last) => count(&metrics, Rejected::Timeout),
    }
}

async fn http<S>(io: S, routes: Routes, config: Arc<WebConfig>, metrics: Shared)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let counted = metrics.clone();
    let service = service_fn(move |req: Request<Incoming>| {
        let (routes, config, metrics) = (routes.clone(), config.clone(), counted.clone());
        async move {
            if let Some(users) = &config.users {
                let auth = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok());
                if !users.check(auth).await {
                    count(&metrics, Rejected::Unauthorized);
                    let mut r = plain(StatusCode::UNAUTHORIZED, b"Unauthorized\n");
                    r.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        header::HeaderValue::from_static("Basic realm=\"mmaplock-prof\""),
                    );
                    return Ok::<_, std::convert::Infallible>(r);
                }
            }
            Ok(respond(&routes, &req))
        }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(16 * 1024)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        if e.is_timeout() {
            count(&metrics, Rejected::Timeout);
        }
        log::debug!("metrics connection: {e}");
    }
}

/// Accepts and serves until the task is dropped.
pub async fn serve(listener: TcpListener, routes: Routes, web: Web, metrics: Shared) {
    let cap = max_connections();
    let table = Rc::new(RefCell::new(Connections::default()));
    let mut told = false;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors (or memory): the connection waits in the backlog; try
                // again shortly rather than spin or stop.
                if !told {
                    eprintln!("mmaplock-prof agent: cannot accept a connection: {e}; retrying");
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        told = false;
        // At the cap: close the connection quiet the longest, or this one.
        if table.borrow().open.len() >= cap {
            let now = Instant::now();
            let quietest = table
                .borrow()
                .open
                .iter()
                .map(|(id, (last, h))| (last.get(), *id, h.clone()))
                .min_by_key(|(last, id, _)| (*last, *id));
            count(&metrics, Rejected::Limit);
            match quietest {
                Some((last, id, h)) if now.duration_since(last) >= EVICTABLE_AFTER => {
                    h.abort();
                    table.borrow_mut().open.remove(&id);
                }
                _ => {
                    drop(stream);
                    continue;
                }
            }
        }
        let last = Rc::new(Cell::new(Instant::now()));
        let id = {
            let mut t = table.borrow_mut();
            t.next += 1;
            t.next
        };
        let guard = Registered {
            id,
            table: table.clone(),
            metrics: metrics.clone(),
        };
        let served = connection(
            stream,
            last.clone(),
            routes.clone(),
            web.clone(),
            metrics.clone(),
        );
        // The guard goes with the task, however it ends (aborted included).
        let task = tokio::task::spawn_local(async move {
            let _guard = guard;
            served.await;
        });
        let mut t = table.borrow_mut();
        t.open.insert(id, (last, task.abort_handle()));
        if let Ok(mut m) = metrics.0.lock() {
            m.http.open = t.open.len() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protobuf_only_when_asked() {
        assert!(wants_protobuf(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3"
        ));
        assert!(!wants_protobuf(
            "application/openmetrics-text;version=1.0.0"
        ));
        assert!(!wants_protobuf(""));
    }

    #[test]
    fn the_cap_leaves_room_for_the_kernel_side() {
        let n = max_connections();
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        assert!((8..=MAX_CONNECTIONS).contains(&n));
        assert!(n as u64 + RESERVED_FDS <= soft.max(RESERVED_FDS + 8));
    }
}
