//! One HTTP client per push target: rustls (`--push-ca`'s certificates, else Mozilla's roots),
//! the `--push-header`s on every request, and a deadline on the whole request so that a slow
//! backend costs its exporter's thread a bounded time, never the agent's loop. Answers are
//! sorted into what a retry may fix and what it will not.

use std::{path::Path, sync::Arc, time::Duration};

use ureq::tls::{PemItem, RootCerts, TlsConfig};

use super::PushError;

pub struct Client {
    agent: ureq::Agent,
    headers: Vec<(String, String)>,
}

/// Why a request did not get a 2xx.
#[derive(Debug)]
pub enum Failure {
    /// No answer: refused, reset, timed out, a TLS failure. Retried.
    Unreachable(String),
    /// The backend is busy or failing (429, 5xx, 408). Retried.
    Busy(u16, String),
    /// The backend refused the payload (other 4xx): a retry would be refused too.
    Rejected(u16, String),
}

impl Failure {
    pub fn retry(&self) -> bool {
        !matches!(self, Failure::Rejected(..))
    }

    /// The `reason` label of `mmaplock_export_dropped_total` for a payload given up on.
    pub fn reason(&self) -> &'static str {
        match self {
            Failure::Unreachable(_) => "unreachable",
            Failure::Busy(..) => "backend_error",
            Failure::Rejected(..) => "rejected",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unreachable(e) => write!(f, "{e}"),
            Failure::Busy(s, b) | Failure::Rejected(s, b) => write!(f, "HTTP {s}: {b}"),
        }
    }
}

/// The certificates of a PEM file (exit 2 when it holds none or cannot be read).
fn roots(ca: &Path) -> Result<RootCerts, PushError> {
    let bad = |why: String| PushError::Ca(ca.to_path_buf(), why);
    let pem = std::fs::read(ca).map_err(|e| bad(e.to_string()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        if let PemItem::Certificate(c) = item.map_err(|e| bad(e.to_string()))? {
            certs.push(c);
        }
    }
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(RootCerts::Specific(Arc::new(certs)))
}

impl Client {
    pub fn new(
        ca: Option<&Path>,
        headers: &[(String, String)],
        deadline: Duration,
    ) -> Result<Self, PushError> {
        let roots = match ca {
            Some(ca) => roots(ca)?,
            None => RootCerts::WebPki,
        };
        let config = ureq::Agent::config_builder()
            .tls_config(TlsConfig::builder().root_certs(roots).build())
            .timeout_global(Some(deadline))
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(concat!("mmaplock-prof/", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Client {
            agent: config.into(),
            headers: headers.to_vec(),
        })
    }

    /// POSTs `body` to `url` with the `query` pairs (percent-encoded here).
    pub fn post(
        &self,
        url: &str,
        query: &[(&'static str, String)],
        content_type: &str,
        body: &[u8],
    ) -> Result<(), Failure> {
        let mut req = (self.agent.post(url))
            .query_pairs(query.iter().map(|(k, v)| (*k, v.as_str())))
            .header("Content-Type", content_type);
        for (k, v) in &self.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let mut resp = req
            .send(body)
            .map_err(|e| Failure::Unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(());
        }
        // What the backend said, on one line and short (it goes to the log).
        let said: String = (resp.body_mut().with_config().limit(4096).read_to_string())
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .take(200)
            .collect();
        Err(match status {
            408 | 429 | 500.. => Failure::Busy(status, said),
            _ => Failure::Rejected(status, said),
        })
    }
}
