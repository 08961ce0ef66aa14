//! A TLS connection as the gRPC server hands it to tonic: the stream, and what its
//! handshake established, worked out once per connection.
//!
//! tonic's own `Connected` for a rustls stream (`TlsConnectInfo`) copies the client's whole
//! certificate chain for every connection, beside the copy rustls keeps for the session,
//! and the service then parsed the leaf certificate again for every stream. Here each
//! connection holds its client's address and node identity (a name and a 40-byte
//! [`CertificateId`]), parsed from the leaf once, right after the handshake.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use edgebeat_proto::registration::NodeName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::ingress::CertificateId;
use crate::tls;

/// What a connection's TLS handshake established (a [`Connection`]'s): the client's
/// address, and its certificate's node identity when it presented one (`Err` when that
/// certificate names no node). Cheap to clone: tonic puts a copy in the
/// extensions of every request of the connection.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionInfo(Arc<Established>);

#[derive(Debug)]
struct Established {
    remote: SocketAddr,
    identity: Option<Result<(NodeName, CertificateId), tls::IdentityError>>,
    /// The client certificate's notAfter, Unix seconds.
    not_after: Option<i64>,
}

impl ConnectionInfo {
    /// The client's address.
    pub(crate) fn remote(&self) -> SocketAddr {
        self.0.remote
    }

    /// The node identity of the client certificate: `None` without one, `Err` when the
    /// certificate names no node (CN=`system:node:<name>`, O=`system:nodes`) or does not
    /// parse.
    pub(crate) fn identity(
        &self,
    ) -> Option<&Result<(NodeName, CertificateId), tls::IdentityError>> {
        self.0.identity.as_ref()
    }

    /// The client certificate's notAfter (Unix seconds), when it presented one.
    pub(crate) fn not_after(&self) -> Option<i64> {
        self.0.not_after
    }
}

/// A finished TLS connection with its [`ConnectionInfo`].
pub(crate) struct Connection {
    tls: TlsStream<TcpStream>,
    info: ConnectionInfo,
}

impl Connection {
    /// `tls`, from `remote`, with its client certificate's identity parsed.
    pub(crate) fn new(tls: TlsStream<TcpStream>, remote: SocketAddr) -> Self {
        let leaf = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first());
        let identity = leaf.map(|leaf| Ok((tls::node_identity(leaf)?, tls::certificate_id(leaf)?)));
        let not_after = leaf.and_then(|leaf| tls::not_after(leaf));
        Self {
            tls,
            info: ConnectionInfo(Arc::new(Established {
                remote,
                identity,
                not_after,
            })),
        }
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tls).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_shutdown(cx)
    }
}
