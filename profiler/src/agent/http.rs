//! The /metrics endpoint: OpenMetrics text by default, Prometheus's protobuf (native
//! histograms) when the scraper's Accept header asks for it.

use std::{net::SocketAddr, sync::Arc};

use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::output::prometheus::{encode_protobuf, encode_text};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROTOBUF: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// Does the scraper accept the protobuf exposition?
pub fn wants_protobuf(accept: &str) -> bool {
    accept.contains("application/vnd.google.protobuf")
        && accept.contains("io.prometheus.client.MetricFamily")
}

fn respond(registry: &Registry, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(
                b"mmaplock-prof: see /metrics\n",
            )))
            .expect("static response");
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (body, kind) = match wants_protobuf(accept).then(|| encode_protobuf(registry)) {
        Some(Some(bytes)) => (Bytes::from(bytes), PROTOBUF),
        _ => match encode_text(registry) {
            Ok(text) => (Bytes::from(text), OPENMETRICS),
            Err(_) => {
                return Response::builder()
                    .status(StatusCode::INTERNAL_SERVER_ERROR)
                    .body(Full::new(Bytes::from_static(b"encoding failed\n")))
                    .expect("static response");
            }
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

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        tokio::task::spawn_local(async move {
            let service = service_fn(move |req| {
                let r = respond(&registry, &req);
                async move { Ok::<_, std::convert::Infallible>(r) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                log::debug!("metrics connection: {e}");
            }
        });
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
}
