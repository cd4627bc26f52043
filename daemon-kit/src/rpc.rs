//! The control-plane transport: TCP (with TLS when the process installed it, [`crate::tls`]) or
//! Unix sockets, authenticated with the cluster key ([`crate::auth`]), then tarpc over
//! length-delimited postcard frames of bounded length.

use std::{
    fmt, io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    pin::Pin,
    task::{Context as TaskContext, Poll},
    time::{Duration, Instant},
};

use flyt_protocol::control::auth::ServiceName;
use futures::{Future, Sink, Stream, StreamExt};
use serde::{Serialize, de::DeserializeOwned};
use tarpc::{
    ClientMessage, Response,
    server::{BaseChannel, Channel, Serve},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream, UnixListener, UnixStream},
};
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tracing::Instrument as _;

use crate::{
    auth::{self, AuthError, ClusterKey},
    codec::PostcardCodec,
    tls::{self, Tls},
};

/// Largest control frame either side accepts; control messages are small (a node's report is
/// a few KiB), so a bigger length is a broken or hostile peer.
pub const MAX_FRAME_BYTES: usize = 4 << 20;
/// Requests one connection may have in flight; more wait (per-peer back-pressure).
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 16;
/// How long a TLS listener waits for a client's first TLS record before taking it for a plain
/// client (which waits for the server to speak first).
const TLS_HELLO_WAIT: Duration = Duration::from_secs(2);
/// How long a connection attempt may take, handshake included.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a control connection failed.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum RpcError {
    /// cannot reach {0}: {1}
    Connect(Endpoint, io::Error),
    /// {0} did not complete the connection and its handshake within {1:?}
    ConnectTimeout(Endpoint, Duration),
    /// {0} refused the connection: {1}
    Auth(Endpoint, AuthError),
    /// TLS with {0} failed: {1}
    Tls(Endpoint, String),
    /// cannot listen on {0}: {1}
    Bind(Endpoint, io::Error),
    /// `{0}` is not an address: use `host:port` or `unix:/path`
    BadEndpoint(String),
}

/// Where a control service listens: `host:port` or `unix:/path`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Tcp(String),
    Unix(PathBuf),
}

impl Endpoint {
    /// Parses `host:port` or `unix:/path`.
    pub fn parse(text: &str) -> Result<Self, RpcError> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(RpcError::BadEndpoint(text.to_string()));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        match text.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(Self::Tcp(text.to_string())),
            _ => Err(RpcError::BadEndpoint(text.to_string())),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(address) => formatter.write_str(address),
            Self::Unix(path) => write!(formatter, "unix:{}", path.display()),
        }
    }
}

/// A connected TCP or Unix stream, or TLS over TCP (see [`crate::tls`]).
pub enum ControlStream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// TLS, this end having connected.
    TlsClient(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// TLS, this end having accepted.
    TlsServer(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// Runs `$body` with `$stream` bound to whichever stream `$self` holds, pinned.
macro_rules! each_stream {
    ($self:expr, $stream:ident => $body:expr) => {
        match $self.get_mut() {
            ControlStream::Tcp(inner) => {
                let $stream = Pin::new(inner);
                $body
            }
            ControlStream::Unix(inner) => {
                let $stream = Pin::new(inner);
                $body
            }
            ControlStream::TlsClient(inner) => {
                let $stream = Pin::new(&mut **inner);
                $body
            }
            ControlStream::TlsServer(inner) => {
                let $stream = Pin::new(&mut **inner);
                $body
            }
        }
    };
}

impl AsyncRead for ControlStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        each_stream!(self, stream => stream.poll_read(cx, buf))
    }
}

impl AsyncWrite for ControlStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        each_stream!(self, stream => stream.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        each_stream!(self, stream => stream.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        each_stream!(self, stream => stream.poll_shutdown(cx))
    }
}

/// The tarpc transport over a stream: length-delimited frames of at most [`MAX_FRAME_BYTES`],
/// postcard inside.
pub type PostcardTransport<S, Item, SinkItem> = tarpc::serde_transport::Transport<S, Item, SinkItem, PostcardCodec<Item, SinkItem>>;

/// Wraps an authenticated stream for tarpc.
pub fn transport<S, Item, SinkItem>(stream: S) -> PostcardTransport<S, Item, SinkItem>
where
    S: AsyncRead + AsyncWrite,
    Item: DeserializeOwned,
    SinkItem: Serialize,
{
    let framing = LengthDelimitedCodec::builder().max_frame_length(MAX_FRAME_BYTES).new_codec();
    tarpc::serde_transport::new(Framed::new(stream, framing), PostcardCodec::default())
}

/// Connects to `endpoint` and proves the cluster key for `service` within [`CONNECT_TIMEOUT`];
/// the stream is ready for [`transport`].
pub async fn connect(endpoint: &Endpoint, key: &ClusterKey, service: ServiceName) -> Result<ControlStream, RpcError> {
    connect_within(endpoint, key, service, CONNECT_TIMEOUT).await
}

/// [`connect`] with the caller's own bound on the connection and the handshake together.
pub async fn connect_within(
    endpoint: &Endpoint,
    key: &ClusterKey,
    service: ServiceName,
    timeout: Duration,
) -> Result<ControlStream, RpcError> {
    connect_with(endpoint, key, service, timeout, tls::installed()).await
}

/// [`connect_within`] with the TLS to use on TCP (`None`: plain TCP).
pub async fn connect_with(
    endpoint: &Endpoint,
    key: &ClusterKey,
    service: ServiceName,
    timeout: Duration,
    tls: Option<&Tls>,
) -> Result<ControlStream, RpcError> {
    let attempt = async {
        let mut stream = match endpoint {
            Endpoint::Tcp(address) => {
                let stream = TcpStream::connect(address).await.map_err(|error| RpcError::Connect(endpoint.clone(), error))?;
                let _ = stream.set_nodelay(true);
                match tls {
                    None => ControlStream::Tcp(stream),
                    Some(tls) => {
                        let name = tls::server_name(address).map_err(|error| RpcError::Tls(endpoint.clone(), error))?;
                        let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
                        let secured = connector.connect(name, stream).await.map_err(|error| {
                            RpcError::Tls(
                                endpoint.clone(),
                                format!("{error} (is TLS on there, with a certificate from this cluster's CA?)"),
                            )
                        })?;
                        ControlStream::TlsClient(Box::new(secured))
                    }
                }
            }
            Endpoint::Unix(path) => {
                ControlStream::Unix(UnixStream::connect(path).await.map_err(|error| RpcError::Connect(endpoint.clone(), error))?)
            }
        };
        auth::connect_within(&mut stream, key, service, timeout).await.map_err(|error| match error {
            AuthError::Timeout(_) => RpcError::ConnectTimeout(endpoint.clone(), timeout),
            // A TLS endpoint closes a plain client before its challenge or after its first bytes.
            AuthError::Refused if tls.is_none() && matches!(endpoint, Endpoint::Tcp(_)) => {
                RpcError::Auth(endpoint.clone(), AuthError::RefusedPlain)
            }
            AuthError::Io(error)
                if error.kind() == io::ErrorKind::UnexpectedEof && tls.is_none() && matches!(endpoint, Endpoint::Tcp(_)) =>
            {
                RpcError::Auth(endpoint.clone(), AuthError::RefusedPlain)
            }
            other => RpcError::Auth(endpoint.clone(), other),
        })?;
        Ok(stream)
    };
    tokio::time::timeout(timeout, attempt).await.map_err(|_| RpcError::ConnectTimeout(endpoint.clone(), timeout))?
}

/// A tarpc context whose deadline is `timeout` from now. Every control call passes one: spawns
/// and resizes outlive tarpc's 10 s default, heartbeats must fail well before the next one.
pub fn deadline(timeout: Duration) -> tarpc::context::Context {
    let mut context = tarpc::context::current();
    context.deadline = Instant::now() + timeout;
    context
}

/// Runs `work` as a task of its own and waits for it, so a handler whose request is cancelled
/// (deadline passed, connection closed) does not stop a state change half way. The task logs
/// inside the caller's span (which names the peer).
pub async fn detached<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> Option<T> {
    tokio::spawn(work.in_current_span()).await.ok()
}

/// A listening TCP socket (with the TLS its connections must speak, if any) or Unix socket.
pub enum ControlListener {
    Tcp(TcpListener, Option<Tls>),
    Unix(UnixListener, PathBuf),
}

impl ControlListener {
    /// Listens on `endpoint`. A Unix socket replaces a stale file and gets `unix_mode`
    /// (0o600 for owner-only admin sockets).
    /// TCP connections speak this process's TLS, if it installed one ([`crate::tls::install`]).
    pub async fn bind(endpoint: &Endpoint, unix_mode: u32) -> Result<Self, RpcError> {
        Self::bind_with(endpoint, unix_mode, tls::installed().cloned()).await
    }

    /// [`ControlListener::bind`] with the TLS TCP connections must speak (`None`: plain TCP).
    pub async fn bind_with(endpoint: &Endpoint, unix_mode: u32, tls: Option<Tls>) -> Result<Self, RpcError> {
        let bind_error = |error| RpcError::Bind(endpoint.clone(), error);
        match endpoint {
            Endpoint::Tcp(address) => Ok(Self::Tcp(TcpListener::bind(address).await.map_err(bind_error)?, tls)),
            Endpoint::Unix(path) => Ok(Self::Unix(bind_unix(path, unix_mode).map_err(bind_error)?, path.clone())),
        }
    }

    /// The bound address (TCP ports resolved).
    pub fn local_endpoint(&self) -> Endpoint {
        match self {
            Self::Tcp(listener, _) => {
                Endpoint::Tcp(listener.local_addr().map(|address| address.to_string()).unwrap_or_else(|_| "?".into()))
            }
            Self::Unix(_, path) => Endpoint::Unix(path.clone()),
        }
    }

    /// Accepts one connection; returns it with a peer description for logs. A TLS listener's
    /// connection still has its TLS handshake to make ([`ControlListener::secure`]).
    pub async fn accept(&self) -> io::Result<(ControlStream, String)> {
        match self {
            Self::Tcp(listener, _) => {
                let (stream, peer) = listener.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok((ControlStream::Tcp(stream), peer.to_string()))
            }
            Self::Unix(listener, path) => {
                let (stream, _) = listener.accept().await?;
                let peer = match stream.peer_cred() {
                    Ok(credentials) => format!("{} (uid {}, pid {:?})", path.display(), credentials.uid(), credentials.pid()),
                    Err(_) => path.display().to_string(),
                };
                Ok((ControlStream::Unix(stream), peer))
            }
        }
    }
}

impl ControlListener {
    /// Makes the TLS handshake of an accepted TCP connection when this listener speaks TLS.
    pub async fn secure(&self, stream: ControlStream) -> Result<ControlStream, String> {
        match (self, stream) {
            (Self::Tcp(_, Some(tls)), ControlStream::Tcp(stream)) => {
                // A TLS client opens at once with a handshake record (type 22). A plain client
                // sends nothing (it waits for the cluster-key challenge) or something else: it is
                // closed soon, so it fails with a clear error rather than a timeout.
                let mut first = [0u8; 1];
                match tokio::time::timeout(TLS_HELLO_WAIT, stream.peek(&mut first)).await {
                    Ok(Ok(1)) if first[0] == 22 => {}
                    Ok(Ok(_)) => return Err("a plain-TCP client: this endpoint requires TLS".into()),
                    Ok(Err(error)) => return Err(format!("closed before its TLS handshake: {error}")),
                    Err(_) => return Err(format!("no TLS handshake within {TLS_HELLO_WAIT:?}: a plain-TCP client?")),
                }
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
                match tokio::time::timeout(CONNECT_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(secured)) => Ok(ControlStream::TlsServer(Box::new(secured))),
                    Ok(Err(error)) => {
                        Err(format!("TLS handshake failed: {error} (a plain-TCP client, or a certificate not from this cluster's CA)"))
                    }
                    Err(_) => Err(format!("no TLS handshake within {CONNECT_TIMEOUT:?}")),
                }
            }
            (_, stream) => Ok(stream),
        }
    }
}

/// Binds a Unix socket at `path` with `mode`, creating its folder and replacing a stale socket.
pub fn bind_unix(path: &Path, mode: u32) -> io::Result<UnixListener> {
    if let Some(folder) = path.parent()
        && !folder.as_os_str().is_empty()
    {
        std::fs::create_dir_all(folder)?;
    }
    if std::fs::symlink_metadata(path).is_ok() {
        // A socket left by a previous run: nobody can be listening on it if binding would fail.
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

/// Serves one authenticated connection with `serve` until the peer goes away, at most
/// [`MAX_IN_FLIGHT_PER_CONNECTION`] requests at a time. How the connection ended is logged in
/// plain words, inside the span [`accept_loop`] opens (which names the peer and the service).
pub async fn serve_connection<S, Req, Resp>(stream: ControlStream, serve: S)
where
    S: Serve<Req = Req, Resp = Resp> + Clone + Send + 'static,
    Req: tarpc::RequestName + DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
{
    let transport: PostcardTransport<ControlStream, ClientMessage<Req>, Response<Resp>> = transport(stream);
    BaseChannel::with_defaults(EndLogged(transport))
        .execute(serve)
        .for_each_concurrent(MAX_IN_FLIGHT_PER_CONNECTION, |request| request)
        .await;
}

/// What a failed read of a control connection means, in words for a log line.
pub fn describe_end(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionAborted => {
            "the peer dropped the connection (it exited or was killed)".to_string()
        }
        io::ErrorKind::UnexpectedEof => "the peer closed the connection in the middle of a message".to_string(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "the connection timed out".to_string(),
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput => format!("the peer sent a malformed message ({error}); closed"),
        _ => format!("the connection failed: {error}"),
    }
}

/// A transport whose read errors end the stream after one plain log line, instead of tarpc's
/// "Requests stream errored out" without a peer.
struct EndLogged<T>(T);

impl<T, Item> Stream for EndLogged<T>
where
    T: Stream<Item = io::Result<Item>> + Unpin,
{
    type Item = io::Result<Item>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        match Pin::new(&mut self.get_mut().0).poll_next(cx) {
            Poll::Ready(Some(Err(error))) => {
                tracing::info!("connection ended: {}", describe_end(&error));
                Poll::Ready(None)
            }
            Poll::Ready(None) => {
                tracing::debug!("connection closed by the peer");
                Poll::Ready(None)
            }
            other => other,
        }
    }
}

impl<T, SinkItem> Sink<SinkItem> for EndLogged<T>
where
    T: Sink<SinkItem, Error = io::Error> + Unpin,
{
    type Error = io::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.get_mut().0).poll_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: SinkItem) -> Result<(), Self::Error> {
        Pin::new(&mut self.get_mut().0).start_send(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.get_mut().0).poll_close(cx)
    }
}

/// Accepts connections forever; each one is authenticated (failures are logged and closed)
/// and handed to `dispatch` with the service it proved, on a task of its own.
pub async fn accept_loop<D, F>(listener: ControlListener, key: ClusterKey, served: Vec<ServiceName>, dispatch: D)
where
    D: Fn(ServiceName, ControlStream) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let dispatch = std::sync::Arc::new(dispatch);
    let listener = std::sync::Arc::new(listener);
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let key = key.clone();
        let served = served.clone();
        let dispatch = dispatch.clone();
        let listener = listener.clone();
        tokio::spawn(async move {
            stream = match listener.secure(stream).await {
                Ok(stream) => stream,
                Err(reason) => return tracing::warn!("control connection from {peer} refused: {reason}"),
            };
            match auth::accept(&mut stream, &key, &served).await {
                Ok(service) => {
                    // Every line logged while serving this connection names its peer.
                    let span = tracing::info_span!("conn", %peer, service = service.as_str());
                    async {
                        tracing::debug!("control connection authenticated");
                        dispatch(service, stream).await;
                    }
                    .instrument(span)
                    .await;
                }
                Err(AuthError::Timeout(limit)) => {
                    tracing::warn!("control connection from {peer} closed: no handshake within {limit:?}")
                }
                Err(error) => tracing::warn!("control connection from {peer} refused: {error}"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(Endpoint::parse("127.0.0.1:80").unwrap(), Endpoint::Tcp("127.0.0.1:80".into()));
        assert_eq!(Endpoint::parse("[::1]:0").unwrap(), Endpoint::Tcp("[::1]:0".into()));
        assert_eq!(Endpoint::parse("unix:/run/x.sock").unwrap(), Endpoint::Unix("/run/x.sock".into()));
        for bad in ["", "unix:", "host", "host:port", ":80"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
