//! TLS and basic auth for `/metrics`, from a web configuration file in the format Prometheus
//! exporters share (exporter-toolkit's `--web.config.file`), so that an operator's existing
//! file, certificates and bcrypt hashes work as they are:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt          # relative paths: from the file's directory
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert
//!   client_ca_file: clients-ca.crt
//!   min_version: TLS12             # TLS12 (default) or TLS13; max_version likewise
//! basic_auth_users:
//!   prometheus: $2y$10$...         # bcrypt (htpasswd -nBC 10 "" | tr -d ':\n')
//! ```
//!
//! Keys this agent does not implement (`http_server_config`, `cipher_suites`, ...) are
//! refused by name rather than ignored. `RequestClientCert` and `RequireAnyClientCert` are
//! refused too: a client certificate nobody verifies proves nothing.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use base64::Engine as _;
use serde::Deserialize;
use tokio_rustls::rustls::{
    self, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};

#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("{0}: {1}")]
    Invalid(PathBuf, String),
}

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShape {
    tls_server_config: Option<TlsShape>,
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsShape {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    min_version: Option<String>,
    max_version: Option<String>,
}

/// What the file configures.
pub struct WebConfig {
    /// None: plain HTTP.
    pub tls: Option<Arc<ServerConfig>>,
    /// None: no authentication.
    pub users: Option<Users>,
}

/// The largest web configuration file read (an operator's file of a few lines).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The web configuration (`--web.config.file`), or plain HTTP, as the server shares it.
pub fn shared(path: Option<&Path>, quiet: bool) -> Result<super::http::Web, WebConfigError> {
    let w = match path {
        Some(p) => WebConfig::load(p)?,
        None => WebConfig {
            tls: None,
            users: None,
        },
    };
    if w.users.is_some() && w.tls.is_none() && !quiet {
        eprintln!(
            "mmaplock-prof agent: basic auth without TLS: passwords cross the network in clear (add tls_server_config)"
        );
    }
    Ok(Arc::new(std::sync::RwLock::new(Arc::new(w))))
}

/// SIGHUP: the web configuration too (renewed certificates, changed users); a bad file
/// keeps the one in force.
pub fn reload(path: &Path, web: &super::http::Web) {
    match WebConfig::load(path) {
        Ok(w) => {
            if let Ok(mut current) = web.write() {
                *current = Arc::new(w);
            }
        }
        Err(e) => eprintln!("mmaplock-prof agent: {e}; keeping the current web configuration"),
    }
}

impl WebConfig {
    pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
        let read = || -> std::io::Result<String> {
            let f = std::fs::File::open(path)?;
            if f.metadata()?.len() > MAX_FILE_BYTES {
                return Err(std::io::Error::other(format!(
                    "larger than {MAX_FILE_BYTES} bytes: not a web configuration"
                )));
            }
            std::io::read_to_string(f)
        };
        let text = read().map_err(|e| WebConfigError::Read(path.into(), e))?;
        let invalid = |what: String| WebConfigError::Invalid(path.into(), what);
        let shape: FileShape = if text.trim().is_empty() {
            FileShape::default()
        } else {
            serde_saphyr::from_str(&text).map_err(|e| invalid(one_line(&e.to_string())))?
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let tls = match shape.tls_server_config {
            Some(t) => Some(Arc::new(tls_config(t, dir).map_err(invalid)?)),
            None => None,
        };
        let users = match shape.basic_auth_users {
            Some(u) if !u.is_empty() => Some(Users::new(u).map_err(invalid)?),
            _ => None,
        };
        Ok(WebConfig { tls, users })
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn version(v: &str) -> Result<&'static rustls::SupportedProtocolVersion, String> {
    match v {
        "TLS12" => Ok(&rustls::version::TLS12),
        "TLS13" => Ok(&rustls::version::TLS13),
        // exporter-toolkit also takes TLS10 and TLS11, which rustls (rightly) never speaks.
        _ => Err(format!("TLS version {v:?}: TLS12 or TLS13")),
    }
}

fn tls_config(t: TlsShape, dir: &Path) -> Result<ServerConfig, String> {
    let at = |p: &Path| dir.join(p);
    let cert_file = t
        .cert_file
        .as_deref()
        .map(at)
        .ok_or("tls_server_config: missing cert_file")?;
    let key_file = t
        .key_file
        .as_deref()
        .map(at)
        .ok_or("tls_server_config: missing key_file")?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_file)
        .and_then(|it| it.collect())
        .map_err(|e| format!("cert_file {}: {e}", cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "cert_file {}: no certificate in it",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&key_file)
        .map_err(|e| format!("key_file {}: {e}", key_file.display()))?;
    let min = version(t.min_version.as_deref().unwrap_or("TLS12"))?;
    let max = version(t.max_version.as_deref().unwrap_or("TLS13"))?;
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        [&rustls::version::TLS12, &rustls::version::TLS13]
            .into_iter()
            .filter(|v| {
                let rank = |x: &rustls::SupportedProtocolVersion| {
                    (x.version == rustls::ProtocolVersion::TLSv1_3) as u8
                };
                rank(v) >= rank(min) && rank(v) <= rank(max)
            })
            .collect();
    if versions.is_empty() {
        return Err("min_version is above max_version".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| e.to_string())?;
    let auth = t.client_auth_type.as_deref().unwrap_or("NoClientCert");
    let roots = || -> Result<rustls::RootCertStore, String> {
        let ca = t
            .client_ca_file
            .as_deref()
            .map(at)
            .ok_or_else(|| format!("client_auth_type {auth} needs client_ca_file"))?;
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(&ca)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("client_ca_file {}: {e}", ca.display()))?;
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("client_ca_file {}: {e}", ca.display()))?;
        }
        Ok(roots)
    };
    let builder = match auth {
        "" | "NoClientCert" => {
            if t.client_ca_file.is_some() {
                return Err("client_ca_file is set but client_auth_type is NoClientCert".into());
            }
            builder.with_no_client_auth()
        }
        "VerifyClientCertIfGiven" | "RequireAndVerifyClientCert" => {
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots()?), provider);
            let v = if auth == "VerifyClientCertIfGiven" {
                v.allow_unauthenticated()
            } else {
                v
            };
            builder.with_client_cert_verifier(v.build().map_err(|e| e.to_string())?)
        }
        "RequestClientCert" | "RequireAnyClientCert" => {
            return Err(format!(
                "client_auth_type {auth}: a certificate that is not verified proves nothing; use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
            ));
        }
        other => return Err(format!("unknown client_auth_type {other:?}")),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("cert_file and key_file: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Basic auth users and their bcrypt hashes. Checking a password costs a bcrypt (tens of
/// milliseconds by design), so it runs off the agent's thread, one at a time, and a pair
/// that passed is remembered (as a SHA-256, not the password) so that each scrape does not
/// pay it again.
pub struct Users {
    hashes: BTreeMap<String, String>,
    passed: Mutex<HashSet<[u8; 32]>>,
    one_at_a_time: tokio::sync::Semaphore,
}

/// A hash checked against for unknown users, so that they take as long as known ones.
const DUMMY_HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";
/// Pairs remembered (more are checked again).
const MAX_PASSED: usize = 64;

impl Users {
    fn new(hashes: BTreeMap<String, String>) -> Result<Self, String> {
        for (user, hash) in &hashes {
            // bcrypt: $2a$, $2b$ or $2y$, a cost, 53 characters of salt and hash.
            if hash.len() != 60 || !hash.starts_with("$2") {
                return Err(format!(
                    "basic_auth_users: the password of {user:?} is not a bcrypt hash"
                ));
            }
        }
        Ok(Users {
            hashes,
            passed: Mutex::new(HashSet::new()),
            one_at_a_time: tokio::sync::Semaphore::new(1),
        })
    }

    /// Whether an `Authorization` header value names a user with the right password.
    pub async fn check(&self, authorization: Option<&str>) -> bool {
        let Some((user, password)) = authorization.and_then(parse_basic) else {
            return false;
        };
        let known = self.hashes.get(&user);
        let hash = known.cloned().unwrap_or_else(|| DUMMY_HASH.to_string());
        let key = digest(&user, &password, &hash);
        if known.is_some() && self.passed.lock().is_ok_and(|p| p.contains(&key)) {
            return true;
        }
        let Ok(_permit) = self.one_at_a_time.acquire().await else {
            return false;
        };
        let ok = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .is_ok_and(|r| r.unwrap_or(false));
        if ok && known.is_some() {
            if let Ok(mut p) = self.passed.lock() {
                if p.len() >= MAX_PASSED {
                    p.clear();
                }
                p.insert(key);
            }
            return true;
        }
        false
    }
}

fn digest(user: &str, password: &str, hash: &str) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [user, password, hash] {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part.as_bytes());
    }
    ctx.finish().as_ref().try_into().expect("32 bytes")
}

/// `Basic base64(user:password)`.
fn parse_basic(value: &str) -> Option<(String, String)> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn basic_auth_checks_bcrypt_and_remembers_a_pass() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let users = Users::new(BTreeMap::from([("prom".to_string(), hash)])).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let header = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        rt.block_on(async {
            assert!(users.check(Some(&header("prom", "s3cret"))).await);
            assert!(
                users.check(Some(&header("prom", "s3cret"))).await,
                "remembered"
            );
            assert!(!users.check(Some(&header("prom", "wrong"))).await);
            assert!(!users.check(Some(&header("eve", "s3cret"))).await);
            assert!(!users.check(Some("Bearer x")).await);
            assert!(!users.check(None).await);
        });
        assert_eq!(users.passed.lock().unwrap().len(), 1);
    }

    #[test]
    fn files_are_checked_key_by_key() {
        let dir = tempfile::tempdir().unwrap();
        for (text, needle) in [
            ("tls_server_config:\n  key_file: k\n", "missing cert_file"),
            ("basic_auth_users:\n  a: plain\n", "not a bcrypt hash"),
            (
                "http_server_config:\n  http2: false\n",
                "http_server_config",
            ),
            (
                "tls_server_config:\n  cert_file: c\n  key_file: k\n  cipher_suites: []\n",
                "cipher_suites",
            ),
            (
                "tls_server_config:\n  cert_file: nope.crt\n  key_file: k\n",
                "nope.crt",
            ),
        ] {
            let p = write(dir.path(), "web.yml", text);
            let e = WebConfig::load(&p).err().expect(text).to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(e.starts_with(&p.display().to_string()), "{e}");
        }
        let p = write(dir.path(), "empty.yml", "");
        let w = WebConfig::load(&p).unwrap();
        assert!(w.tls.is_none() && w.users.is_none());
    }
}
