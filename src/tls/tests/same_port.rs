//! TLS and plain on one port (`SSL_PLAIN_ON_SAME_PORT`): the first byte tells them apart, and
//! peeking leaves it for whoever takes the connection.

use super::*;

#[test]
fn the_first_byte_tells_tls_from_plain() {
    assert_eq!(first_byte::classify(0x16), Arrival::Tls);
    for plain in [b'G', b'P', b'H', 0x00, 0x15, 0x17, 0x80, 0xff] {
        assert_eq!(first_byte::classify(plain), Arrival::Plain, "{plain:#x}");
    }
}

#[tokio::test]
async fn peeking_leaves_the_bytes_for_whoever_takes_the_connection() {
    let ca = Ca::new("Test Root CA");
    let leaf = ca.issue(&["broker.test"], &rcgen::PKCS_ECDSA_P256_SHA256, |_| {});
    let (_files, tls) = server_with(&leaf);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let wait = Duration::from_secs(30);

    // A TLS client: peeked as TLS, then the whole handshake still works on the same socket.
    let connector = tokio_rustls::TlsConnector::from(client(ca.roots()));
    let dialing = tokio::spawn(async move {
        let tcp = TcpStream::connect(address).await.unwrap();
        let name = ServerName::try_from("broker.test").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        tls.write_all(b"over tls").await.unwrap();
        tls.shutdown().await.unwrap();
    });
    let (tcp, _) = listener.accept().await.unwrap();
    assert_eq!(first_byte::peek(&tcp, wait).await.unwrap(), Arrival::Tls);
    let mut stream = tls.accept(tcp, WITHIN).await.unwrap();
    let mut got = Vec::new();
    stream.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"over tls");
    dialing.await.unwrap();

    // A plain client: peeked as plain, its bytes all there to read.
    let mut plain = TcpStream::connect(address).await.unwrap();
    plain.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let (mut tcp, _) = listener.accept().await.unwrap();
    assert_eq!(first_byte::peek(&tcp, wait).await.unwrap(), Arrival::Plain);
    let mut got = [0u8; 18];
    tcp.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"GET / HTTP/1.1\r\n\r\n");

    // A client that closes without a word.
    drop(TcpStream::connect(address).await.unwrap());
    let (tcp, _) = listener.accept().await.unwrap();
    assert_eq!(first_byte::peek(&tcp, wait).await.unwrap(), Arrival::Closed);

    // A silent client (server-first protocol): plain, after the wait.
    let _silent = TcpStream::connect(address).await.unwrap();
    let (tcp, _) = listener.accept().await.unwrap();
    assert_eq!(
        first_byte::peek(&tcp, Duration::from_millis(50))
            .await
            .unwrap(),
        Arrival::Silent
    );
}
