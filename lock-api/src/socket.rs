//! A client library's connection socket, found by its address, so a backend can see
//! without reading that the server sent something or closed the connection (a held
//! session's loss, pushed).
//!
//! Client crates (sqlx) do not expose their sockets, so one is found among the process's
//! descriptors: by its address (the local address or port the server saw the connection
//! come from, and the port the client dialled), or as the one new socket to the dialled
//! port after a connect. Where neither tells (a Unix-domain socket, several connects at
//! once behind a proxy) or the platform lists no descriptors, there is none.

use std::net::{IpAddr, SocketAddr};

/// A socket address as (address, port), IPv4-mapped IPv6 addresses as IPv4.
#[cfg(unix)]
fn address(storage: nix::sys::socket::SockaddrStorage) -> Option<(IpAddr, u16)> {
    let addr = match (storage.as_sockaddr_in(), storage.as_sockaddr_in6()) {
        (Some(v4), _) => SocketAddr::from(std::net::SocketAddrV4::from(*v4)),
        (_, Some(v6)) => SocketAddr::from(std::net::SocketAddrV6::from(*v6)),
        _ => return None,
    };
    Some((addr.ip().to_canonical(), addr.port()))
}

/// The descriptor of a client library's TCP socket. It is only peeked at, never read or
/// closed: valid while the library keeps that connection open, so peek only while it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(unix), allow(dead_code))]
pub struct Socket(#[cfg(unix)] std::os::fd::RawFd);

/// What [`Socket::peek`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peeked {
    /// Nothing to read yet.
    Nothing,
    /// Bytes nobody has read yet.
    Unread,
    /// The end of the stream, or a socket error: the connection is over.
    Ended,
}

impl Socket {
    /// Every TCP socket of this process whose peer port is `peer_port`, with its local
    /// address: take one before a client library connects and one after, and
    /// [`Socket::new_since`] names the connection it made. One or two system calls per
    /// open descriptor: call it off the runtime's workers.
    #[cfg(unix)]
    pub fn connected_to(peer_port: u16) -> Vec<(Self, IpAddr, u16)> {
        use nix::sys::socket::{getpeername, getsockname};
        let Some(listing) = ["/proc/self/fd", "/dev/fd"]
            .iter()
            .find_map(|dir| std::fs::read_dir(dir).ok())
        else {
            return Vec::new();
        };
        listing
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
            .filter_map(|fd| {
                let (_, peer) = getpeername(fd).ok().and_then(address)?;
                let (ip, port) = getsockname(fd).ok().and_then(address)?;
                (peer == peer_port).then_some((Self(fd), ip, port))
            })
            .collect()
    }

    /// No descriptors to look through on this platform.
    #[cfg(not(unix))]
    pub fn connected_to(_peer_port: u16) -> Vec<(Self, IpAddr, u16)> {
        Vec::new()
    }

    /// The one socket in `after` that is not in `before` (the same descriptor with the
    /// same local address), if there is exactly one: the connection made in between,
    /// when nothing else in the process connected to that port meanwhile.
    pub fn new_since(
        before: &[(Self, IpAddr, u16)],
        after: &[(Self, IpAddr, u16)],
    ) -> Option<Self> {
        let mut new = after.iter().filter(|socket| !before.contains(socket));
        match (new.next(), new.next()) {
            (Some((socket, _, _)), None) => Some(*socket),
            _ => None,
        }
    }

    /// The only TCP socket of this process whose local port is `local_port` (and local
    /// address `local_ip`, when given) and whose peer port is `peer_port`; `None` if there
    /// is none or more than one. IPv4-mapped IPv6 addresses count as the IPv4 address. One
    /// or two system calls per open descriptor: call it off the runtime's workers.
    pub fn find(local_ip: Option<IpAddr>, local_port: u16, peer_port: u16) -> Option<Self> {
        let local_ip = local_ip.map(|ip| ip.to_canonical());
        let found = Self::connected_to(peer_port);
        let mut found = found.iter().filter(|(_, ip, port)| {
            *port == local_port && local_ip.is_none_or(|local| local == *ip)
        });
        match (found.next(), found.next()) {
            (Some((socket, _, _)), None) => Some(*socket),
            _ => None,
        }
    }

    /// Whether bytes have arrived that nobody has read yet. Never blocks, never reads;
    /// the end of the stream and socket errors are `false` (a read reports those).
    pub fn has_unread(self) -> bool {
        self.peek() == Peeked::Unread
    }

    /// Whether bytes have arrived that nobody has read yet, or the stream has ended.
    /// Never blocks, never reads.
    #[cfg(unix)]
    pub fn peek(self) -> Peeked {
        use nix::errno::Errno;
        use nix::sys::socket::{recv, MsgFlags};
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        match recv(self.0, &mut [0u8; 1], flags) {
            Ok(0) => Peeked::Ended,
            Ok(_) => Peeked::Unread,
            Err(Errno::EAGAIN | Errno::EINTR) => Peeked::Nothing,
            Err(_) => Peeked::Ended,
        }
    }

    /// Never found on this platform.
    #[cfg(not(unix))]
    pub fn peek(self) -> Peeked {
        Peeked::Nothing
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn a_connection_is_found_by_its_address_and_peeked_without_reading() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let local = client.local_addr().unwrap();

        let socket =
            Socket::find(Some(local.ip()), local.port(), port).expect("the client's socket");
        assert_eq!(socket, Socket(client.as_raw_fd()));
        assert_eq!(
            Socket::find(None, local.port(), port),
            Some(socket),
            "by its port alone"
        );
        // Another dialled port matches nothing.
        assert_eq!(Socket::find(Some(local.ip()), local.port(), port ^ 1), None);
        assert!(!socket.has_unread());
        assert_eq!(socket.peek(), Peeked::Nothing);

        server.write_all(b"E").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !socket.has_unread() {
            assert!(
                std::time::Instant::now() < deadline,
                "the byte never showed"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(socket.has_unread(), "peeking left the byte unread");
        let mut byte = [0u8; 1];
        (&client).read_exact(&mut byte).unwrap();
        assert_eq!(&byte, b"E");
        assert!(!socket.has_unread());

        drop(server);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            !socket.has_unread(),
            "the end of the stream is not a message"
        );
        assert_eq!(socket.peek(), Peeked::Ended);
    }

    #[test]
    fn a_new_connection_is_the_one_socket_that_was_not_there_before() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let first = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let before = Socket::connected_to(port);
        assert_eq!(before.len(), 1, "{before:?}");
        let second = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let after = Socket::connected_to(port);
        assert_eq!(
            Socket::new_since(&before, &after),
            Some(Socket(second.as_raw_fd()))
        );
        // Two new ones: which is ours cannot be told.
        let third = TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert_eq!(
            Socket::new_since(&before, &Socket::connected_to(port)),
            None
        );
        drop((first, third));
    }
}
