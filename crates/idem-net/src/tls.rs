//! TLS material from PEM files, and failures told by the step that failed.
//!
//! Owns reading certificates, keys and CA bundles into rustls configurations: a server
//! configuration for the listeners and a client one (the Mozilla roots plus an optional
//! CA file) for upstreams. Connections themselves belong to their callers. Must not log
//! key material, nor put a file's content into an error.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// What could not be set up, naming the file and the step.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading the {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the {what} {} holds no PEM {item}", path.display())]
    Empty {
        what: &'static str,
        path: PathBuf,
        item: &'static str,
    },
    #[error("the {what} {} is not valid PEM: {detail}", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("the TLS certificate and key were refused: {0}")]
    Refused(rustls::Error),
    #[error("the CA file {}: {detail}", path.display())]
    BadCa { path: PathBuf, detail: String },
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in a PEM file (a chain, leaf first, or a CA bundle).
pub fn load_certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
            item: "certificate",
        });
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    const WHAT: &str = "TLS key file";
    let pem = read(WHAT, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what: WHAT,
            path: path.to_path_buf(),
            item: "private key",
        },
        e => TlsError::Pem {
            what: WHAT,
            path: path.to_path_buf(),
            detail: e.to_string(),
        },
    })
}

/// A listener's TLS from a certificate chain and its private key (PEM files), speaking
/// HTTP/1.1.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = load_certificates("TLS certificate file", cert)?;
    let key = load_key(key)?;
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Refused)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// [`server_config`] as an acceptor.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    Ok(TlsAcceptor::from(server_config(cert, key)?))
}

/// A listener's certificate chain and key files, both given or neither.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    /// `None` for neither; an error names the missing half.
    pub fn pair(cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<Option<Self>, String> {
        match (cert, key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(Self { cert, key })),
            (Some(_), None) => Err("a TLS certificate needs its key file too".into()),
            (None, Some(_)) => Err("a TLS key needs its certificate file too".into()),
        }
    }

    /// Loads both files into a listener's TLS.
    pub fn listener(
        &self,
        handshake_timeout: std::time::Duration,
    ) -> Result<crate::serve::ListenerTls, TlsError> {
        Ok(crate::serve::ListenerTls {
            acceptor: acceptor(&self.cert, &self.key)?,
            handshake_timeout,
        })
    }
}

/// A client's TLS: the Mozilla roots, plus every certificate of `ca_file` (a private
/// CA), speaking HTTP/1.1 when `http` is set.
pub fn client_config(ca_file: Option<&Path>, http: bool) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        for cert in load_certificates("CA file", path)? {
            roots.add(cert).map_err(|e| TlsError::BadCa {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })?;
        }
    }
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    if http {
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
    }
    Ok(Arc::new(config))
}

/// The TLS step a connection failure came from, in words, when it came from TLS:
/// The first file a connection URL's query names under one of `params` (a CA file,
/// percent-decoded) that cannot be opened, with why. Drivers read such a file only at the
/// first connection and then do not name it; a store checks it when it is configured.
pub fn unreadable_url_file(url: &str, params: &[&str]) -> Option<(String, std::io::Error)> {
    let (_, query) = url.split_once('?')?;
    query.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        if !params.contains(&name) {
            return None;
        }
        let path = percent_decode(value);
        std::fs::File::open(&path).err().map(|e| (path, e))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// certificate verification (with what to do about it) or the handshake.
pub fn describe_failure(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(describe_rustls(tls));
        }
        // An `io::Error`'s `source()` skips the error it wraps (how TLS streams report).
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(found) = describe_failure(inner) {
                return Some(found);
            }
        }
        cur = e.source();
    }
    // Some clients keep only the text of the TLS error (the Redis client does).
    describe_text(&err.to_string())
}

/// rustls's own words for a refused certificate or a peer's alert, found in a message.
fn describe_text(message: &str) -> Option<String> {
    const CERTIFICATE: &str = "invalid peer certificate: ";
    if let Some(at) = message.find(CERTIFICATE) {
        let detail = &message[at + CERTIFICATE.len()..];
        let hint = if detail.contains("UnknownIssuer") {
            " (the server's certificate is not signed by a trusted CA: give its CA file)"
        } else if detail.contains("not valid for name") || detail.contains("NotValidForName") {
            " (the certificate does not name the host connected to)"
        } else if detail.contains("xpired") {
            " (the certificate has expired)"
        } else {
            ""
        };
        return Some(format!(
            "TLS certificate verification failed: {CERTIFICATE}{detail}{hint}"
        ));
    }
    message
        .find("received fatal alert: ")
        .map(|at| format!("TLS handshake refused by the peer ({})", &message[at..]))
}

fn describe_rustls(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(cert) => {
            let hint = match cert {
                C::UnknownIssuer => {
                    " (the server's certificate is not signed by a trusted CA: give its CA file)"
                }
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    " (the certificate does not name the host connected to)"
                }
                C::Expired | C::ExpiredContext { .. } => " (the certificate has expired)",
                _ => "",
            };
            format!("TLS certificate verification failed: {e}{hint}")
        }
        rustls::Error::AlertReceived(alert) => {
            format!("TLS handshake refused by the peer (alert {alert:?})")
        }
        other => format!("TLS handshake failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_files_name_the_file_and_step() {
        let dir = std::env::temp_dir().join(format!("idem-net-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let e = server_config(&missing, &missing).unwrap_err().to_string();
        assert!(e.starts_with("reading the TLS certificate file"), "{e}");
        assert!(e.contains("missing.pem"), "{e}");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = client_config(Some(&empty), false).unwrap_err().to_string();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn certificate_failures_say_what_to_do() {
        let e = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::other(e);
        let text = describe_failure(&io).unwrap();
        assert!(
            text.starts_with("TLS certificate verification failed"),
            "{text}"
        );
        assert!(text.contains("CA file"), "{text}");
        assert!(describe_failure(&std::io::Error::other("plain")).is_none());
        let text = describe_failure(&std::io::Error::other(
            "redis: invalid peer certificate: UnknownIssuer",
        ))
        .unwrap();
        assert!(text.contains("give its CA file"), "{text}");
    }
}
