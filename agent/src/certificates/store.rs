//! `certDir` on disk: the file names, the store that loads and saves the node's
//! certificate and key (atomically, keeping the previous pair), the pending key, and the
//! bootstrap token file.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use edgebeat_transports::enroll::{BootstrapToken, NodeKeyPair};
use edgebeat_transports::tls;

use super::CertificateError;
use super::identity::NodeIdentity;

/// The node's certificate and its key, one PEM file in `certDir` (kubelet keeps
/// `kubelet-client-current.pem` the same way).
pub const CURRENT_FILE: &str = "edgebeat-client-current.pem";
/// The pair [`CURRENT_FILE`] replaced, kept until the new one has carried an accepted
/// message.
pub const PREVIOUS_FILE: &str = "edgebeat-client-previous.pem";
/// A key whose certificate has not come yet (PKCS#8 PEM).
pub const PENDING_KEY_FILE: &str = "edgebeat-client-pending.key";
/// The site CA (PEM) the enrollment brought.
pub const CA_FILE: &str = "ca.crt";
/// The answer CAs (PEM bundle) the last certificate answer named: the only issuers of the
/// gateway's answer keys the agent trusts (absent while the gateway names none).
pub const ANSWER_CAS_FILE: &str = "answer-ca.crt";
/// Largest bootstrap token file, bytes (1 KiB; a token is 88 characters).
const MAX_TOKEN_FILE_BYTES: u64 = 1024;

/// The files of `certDir` (see the module docs).
#[derive(Debug, Clone)]
pub struct CertStore {
    pub(super) dir: PathBuf,
}

impl CertStore {
    /// The store in `dir`, made (mode 0700) if missing.
    ///
    /// Errors: the I/O error making it.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// The identity in [`CURRENT_FILE`], else in [`PREVIOUS_FILE`] (a file that does not
    /// parse is logged and passed over), with the answer CAs of [`ANSWER_CAS_FILE`]; `None`
    /// when neither holds one.
    pub fn load(&self) -> Option<NodeIdentity> {
        let ca = self.read(CA_FILE)?;
        let answer_cas = self.read(ANSWER_CAS_FILE).map_or_else(Vec::new, |pem| {
            tls::parse_certificates(pem.as_bytes())
                .map(|certs| certs.iter().map(|c| c.to_vec()).collect())
                .unwrap_or_else(|error| {
                    tracing::warn!(file = %self.dir.join(ANSWER_CAS_FILE).display(), %error, "unusable answer CAs; trusting answers from the site CA until the next certificate");
                    Vec::new()
                })
        });
        [CURRENT_FILE, PREVIOUS_FILE].into_iter().find_map(|name| {
            let pair = self.read(name)?;
            NodeIdentity::from_pem(&pair, &ca)
                .inspect_err(|error| {
                    tracing::warn!(file = %self.dir.join(name).display(), %error, "unusable node certificate; passed over");
                })
                .ok()
                .map(|identity| identity.with_answer_cas(answer_cas.clone()))
        })
    }

    /// Stores `identity` as [`CURRENT_FILE`] (and its CA), the one it replaces as
    /// [`PREVIOUS_FILE`], and forgets the pending key.
    ///
    /// Errors: the I/O error; the files are then as before, or with the new pair whole.
    pub fn save(&self, identity: &NodeIdentity) -> std::io::Result<()> {
        write_atomically(&self.dir, CA_FILE, identity.ca_pem.as_bytes(), 0o644)?;
        if identity.answer_cas.is_empty() {
            remove_if_present(&self.dir.join(ANSWER_CAS_FILE))?;
        } else {
            write_atomically(
                &self.dir,
                ANSWER_CAS_FILE,
                identity.answer_cas_pem().as_bytes(),
                0o644,
            )?;
        }
        let current = self.dir.join(CURRENT_FILE);
        if current.exists() {
            std::fs::rename(&current, self.dir.join(PREVIOUS_FILE))?;
        }
        write_atomically(
            &self.dir,
            CURRENT_FILE,
            identity.pair_pem().as_bytes(),
            0o600,
        )?;
        remove_if_present(&self.dir.join(PENDING_KEY_FILE))
    }

    /// Deletes [`PREVIOUS_FILE`], once the current pair has carried an accepted message.
    ///
    /// Errors: the I/O error (other than the file being gone already).
    pub fn forget_previous(&self) -> std::io::Result<()> {
        remove_if_present(&self.dir.join(PREVIOUS_FILE))
    }

    /// The key waiting for its certificate, or a new one (stored first, so that a restart
    /// asks for the same certificate signing request).
    ///
    /// Errors: the key cannot be made or stored.
    pub(super) fn pending_key(&self) -> Result<NodeKeyPair, CertificateError> {
        if let Some(pem) = self.read(PENDING_KEY_FILE) {
            match tls::parse_private_key(pem.as_bytes()) {
                Ok(rustls_pki_types::PrivateKeyDer::Pkcs8(der)) => {
                    match NodeKeyPair::from_pkcs8(der.secret_pkcs8_der()) {
                        Ok(key) => return Ok(key),
                        Err(error) => {
                            tracing::warn!(%error, "unusable pending key; making another")
                        }
                    }
                }
                _ => tracing::warn!("unusable pending key; making another"),
            }
        }
        let key = NodeKeyPair::generate().map_err(|e| CertificateError::Key(e.to_string()))?;
        write_atomically(&self.dir, PENDING_KEY_FILE, key.to_pem().as_bytes(), 0o600)
            .map_err(|e| CertificateError::Key(format!("storing the pending key: {e}")))?;
        Ok(key)
    }

    /// A file of the store as text; `None` when absent or unreadable (logged).
    fn read(&self, name: &str) -> Option<String> {
        let path = self.dir.join(name);
        match edgebeat_hw::read_bounded(&path, edgebeat_hw::MAX_PEM_FILE_BYTES) {
            Ok(bytes) => String::from_utf8(bytes).ok(),
            Err(edgebeat_hw::BoundedReadError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(error) => {
                tracing::warn!(file = %path.display(), %error, "unreadable");
                None
            }
        }
    }
}

/// Writes `bytes` as `dir/name` so that a crash leaves the old file or the new one, whole:
/// a temporary file in `dir` (mode `mode`), `fsync`, rename over `name`, `fsync` of `dir`.
///
/// Errors: the I/O error of any step (the temporary file is removed).
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let temporary = dir.join(format!(".{name}.tmp"));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, dir.join(name))?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Reads the bootstrap token of `file` (surrounding whitespace ignored).
///
/// Errors: [`CertificateError::Token`] naming the file.
pub fn read_token(file: &Path) -> Result<BootstrapToken, CertificateError> {
    let token = |reason: String| CertificateError::Token {
        file: file.to_owned(),
        reason,
    };
    let bytes =
        edgebeat_hw::read_bounded(file, MAX_TOKEN_FILE_BYTES).map_err(|e| token(e.to_string()))?;
    String::from_utf8_lossy(&bytes)
        .trim()
        .parse::<BootstrapToken>()
        .map_err(|e| token(e.to_string()))
}
