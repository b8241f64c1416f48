//! A dedicated connection's own socket, so a held lease's watch can see that the server
//! sent something without reading it (see `held::Watch`).
//!
//! sqlx does not expose its socket, so it is found among the process's descriptors by its
//! address: the local address the server saw the connection come from, and the port the
//! client dialled. Where the server sees another address (a proxy or source NAT between,
//! a Unix-domain socket) or the platform lists no descriptors, there is none.

use std::net::SocketAddr;

/// The descriptor of a dedicated connection's TCP socket. It is only peeked at, never
/// read or closed. Valid while sqlx keeps that connection: sqlx closes it only when a
/// `try_recv` ends at the end of the stream, after which the connection is discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(unix), allow(dead_code))]
pub(crate) struct Socket(#[cfg(unix)] std::os::fd::RawFd);

impl Socket {
    /// The only TCP socket of this process whose local address is `local` and whose peer
    /// port is `peer_port`; `None` if there is none or more than one. IPv4-mapped IPv6
    /// addresses count as the IPv4 address. One or two system calls per open descriptor:
    /// call it off the runtime's workers.
    #[cfg(unix)]
    pub(crate) fn find(local: SocketAddr, peer_port: u16) -> Option<Self> {
        use nix::sys::socket::{getpeername, getsockname, SockaddrStorage};
        let address = |storage: SockaddrStorage| -> Option<(std::net::IpAddr, u16)> {
            let addr = match (storage.as_sockaddr_in(), storage.as_sockaddr_in6()) {
                (Some(v4), _) => SocketAddr::from(std::net::SocketAddrV4::from(*v4)),
                (_, Some(v6)) => SocketAddr::from(std::net::SocketAddrV6::from(*v6)),
                _ => return None,
            };
            Some((addr.ip().to_canonical(), addr.port()))
        };
        let local = Some((local.ip().to_canonical(), local.port()));
        let listing = ["/proc/self/fd", "/dev/fd"]
            .iter()
            .find_map(|dir| std::fs::read_dir(dir).ok())?;
        let mut found = listing
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&fd| {
                getsockname(fd).ok().and_then(address) == local
                    && getpeername(fd)
                        .ok()
                        .and_then(address)
                        .is_some_and(|(_, port)| port == peer_port)
            });
        match (found.next(), found.next()) {
            (Some(fd), None) => Some(Self(fd)),
            _ => None,
        }
    }

    /// No descriptors to look through on this platform.
    #[cfg(not(unix))]
    pub(crate) fn find(_local: SocketAddr, _peer_port: u16) -> Option<Self> {
        None
    }

    /// Whether bytes have arrived that nobody has read yet. Never blocks, never reads;
    /// the end of the stream and socket errors are `false` (a read reports those).
    #[cfg(unix)]
    pub(crate) fn has_unread(self) -> bool {
        use nix::sys::socket::{recv, MsgFlags};
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        recv(self.0, &mut [0u8; 1], flags).is_ok_and(|n| n > 0)
    }

    /// Never found on this platform.
    #[cfg(not(unix))]
    pub(crate) fn has_unread(self) -> bool {
        false
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

        let socket = Socket::find(local, port).expect("the client's socket");
        assert_eq!(socket, Socket(client.as_raw_fd()));
        // Another dialled port matches nothing.
        assert_eq!(Socket::find(local, local.port() ^ 1), None);
        assert!(!socket.has_unread());

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
    }
}
