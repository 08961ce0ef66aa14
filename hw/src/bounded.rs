//! Bounded file reads for configuration and secret files: [`read_bounded`], and
//! [`read_password_file`] for the MQTT password of the agent and of the gateway.
//!
//! A path an operator typed (`passwordFile: /dev/zero`, a multi-gigabyte log, a FIFO with
//! no writer, a directory) must give a clear error at start, not a hang or an out-of-memory
//! kill.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, OFlag, fcntl};

/// Why [`read_bounded`] refused a file. Every message names the path and, where the
/// operator can do something about it, the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BoundedReadError {
    /// Opening or reading failed, e.g.
    /// `reading /etc/x: No such file or directory (os error 2)`.
    #[error("reading {}: {source}", path.display())]
    Io {
        /// The path as given.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The path is a directory, e.g. `/etc/edgebeat: is a directory; point it at a regular
    /// file`.
    #[error("{}: is a directory; point it at a regular file", path.display())]
    Directory {
        /// The path as given.
        path: PathBuf,
    },
    /// The file holds more than `limit` bytes (or is endless, like `/dev/zero`), e.g.
    /// `/dev/zero: larger than 4096 bytes; point it at a regular file of at most 4096 bytes`.
    #[error(
        "{}: larger than {limit} bytes; point it at a regular file of at most {limit} bytes",
        path.display()
    )]
    TooLarge {
        /// The path as given.
        path: PathBuf,
        /// The limit, bytes.
        limit: u64,
    },
    /// A password file that is not UTF-8 text, e.g. `/etc/pw: not UTF-8 text (invalid
    /// utf-8 sequence of 1 bytes from index 0); the password must be UTF-8`.
    #[error("{}: not UTF-8 text ({source}); the password must be UTF-8", path.display())]
    NotUtf8 {
        /// The path as given.
        path: PathBuf,
        /// Where the text stopped being UTF-8.
        #[source]
        source: std::string::FromUtf8Error,
    },
}

/// Largest MQTT password file, bytes (4 KiB): a password or token, not a document; a wrong
/// path such as `/dev/zero` fails at start instead of hanging.
pub const MAX_PASSWORD_FILE_BYTES: u64 = 4 * 1024;

/// Largest PEM file (a certificate chain, a private key or a CA bundle), bytes (1 MiB):
/// room for a long chain or a large CA bundle.
pub const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

/// Reads an MQTT password file: at most [`MAX_PASSWORD_FILE_BYTES`] of UTF-8 text, its
/// trailing CR/LF removed (an editor's final newline is not part of the password; other
/// whitespace is kept). Mounted Kubernetes Secrets and `echo s3cret > file` both read as
/// `s3cret`.
///
/// Errors: those of [`read_bounded`], and [`BoundedReadError::NotUtf8`].
pub fn read_password_file(path: &Path) -> Result<String, BoundedReadError> {
    let bytes = read_bounded(path, MAX_PASSWORD_FILE_BYTES)?;
    let password = String::from_utf8(bytes).map_err(|source| BoundedReadError::NotUtf8 {
        path: path.to_owned(),
        source,
    })?;
    Ok(password.trim_end_matches(['\r', '\n']).to_owned())
}

/// Reads the whole file at `path`, refusing it if it holds more than `limit` bytes.
///
/// At most `limit + 1` bytes are read, whatever the file is: a huge file or an endless
/// device (`/dev/zero`, `/dev/urandom`) costs at most that much memory and returns
/// [`BoundedReadError::TooLarge`] at once. The file is opened with `O_NONBLOCK` (cleared
/// again before reading), so a FIFO without a writer reads as empty instead of blocking at
/// `open(2)`. A directory is [`BoundedReadError::Directory`]; any other failure is
/// [`BoundedReadError::Io`]. Non-regular files such as `/dev/stdin` or `/proc/self/fd/N`
/// are otherwise allowed.
///
/// `limit` is in bytes; a file of exactly `limit` bytes is accepted.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, BoundedReadError> {
    let io_error = |source| BoundedReadError::Io {
        path: path.to_owned(),
        source,
    };
    let file = open_without_blocking(path).map_err(io_error)?;
    if file.metadata().map_err(io_error)?.is_dir() {
        return Err(BoundedReadError::Directory {
            path: path.to_owned(),
        });
    }
    let mut bytes = Vec::new();
    let read = file
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io_error)?;
    if u64::try_from(read).unwrap_or(u64::MAX) > limit {
        return Err(BoundedReadError::TooLarge {
            path: path.to_owned(),
            limit,
        });
    }
    Ok(bytes)
}

/// Opens `path` read-only with `O_NONBLOCK` (so a FIFO without a writer does not block the
/// open), then clears `O_NONBLOCK` so reads of pipes and devices behave normally.
fn open_without_blocking(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)?;
    let flags = OFlag::from_bits_retain(fcntl(&file, FcntlArg::F_GETFL)?);
    fcntl(
        &file,
        FcntlArg::F_SETFL(flags.difference(OFlag::O_NONBLOCK)),
    )?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Runs `f` on a thread and fails the test if it takes longer than 10 s (the regression
    /// this module fixes is a hang).
    fn within_10s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(Duration::from_secs(10))
            .expect("read_bounded hung")
    }

    #[test]
    fn reads_a_small_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, b"s3cret\n").unwrap();
        assert_eq!(read_bounded(&path, 4096).unwrap(), b"s3cret\n");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(read_bounded(&empty, 0).unwrap(), b"");
    }

    #[test]
    fn a_password_file_loses_only_its_trailing_newline_and_must_be_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        std::fs::write(&path, "s3 cret\r\n").unwrap();
        assert_eq!(read_password_file(&path).unwrap(), "s3 cret");
        std::fs::write(&path, [0xffu8, b'\n']).unwrap();
        let err = read_password_file(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{}: not UTF-8 text (", path.display()))
                && err.ends_with("); the password must be UTF-8"),
            "{err}"
        );
        let err = within_10s(|| read_password_file(Path::new("/dev/zero")).unwrap_err());
        assert!(
            matches!(err, BoundedReadError::TooLarge { limit: 4096, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_file_of_exactly_the_limit_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exact");
        std::fs::write(&path, [7u8; 100]).unwrap();
        assert_eq!(read_bounded(&path, 100).unwrap(), [7u8; 100]);
    }

    #[test]
    fn a_file_over_the_limit_is_too_large() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        std::fs::write(&path, [7u8; 101]).unwrap();
        let err = read_bounded(&path, 100).unwrap_err();
        assert!(
            matches!(&err, BoundedReadError::TooLarge { path: p, limit: 100 } if *p == path),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "{}: larger than 100 bytes; point it at a regular file of at most 100 bytes",
                path.display()
            )
        );
    }

    /// The regression: `passwordFile: /dev/zero` used to read forever.
    #[test]
    fn dev_zero_is_too_large_at_once() {
        let err = within_10s(|| read_bounded(Path::new("/dev/zero"), 4096)).unwrap_err();
        assert!(
            matches!(err, BoundedReadError::TooLarge { limit: 4096, .. }),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("/dev/zero: larger than 4096 bytes")
        );
    }

    #[test]
    fn a_directory_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_bounded(dir.path(), 4096).unwrap_err();
        assert!(matches!(err, BoundedReadError::Directory { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "{}: is a directory; point it at a regular file",
                dir.path().display()
            )
        );
    }

    #[test]
    fn a_missing_file_is_an_io_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing");
        let err = read_bounded(&path, 4096).unwrap_err();
        assert!(matches!(err, BoundedReadError::Io { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with(&format!("reading {}: ", path.display())),
            "{err}"
        );
    }

    #[test]
    fn a_fifo_without_a_writer_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        nix::unistd::mkfifo(
            &path,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .unwrap();
        let read = within_10s(move || read_bounded(&path, 4096));
        assert_eq!(read.unwrap(), b"");
    }
}
