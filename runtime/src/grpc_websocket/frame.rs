//! What one WebSocket message of a gRPC-over-WebSocket call holds, as `golang.stackrox.io/grpc-http1`
//! (v0.5.1, the version upstream argocd-agent v0.9.0 pins) frames it: each binary message is one
//! gRPC length-prefixed message — a flag byte and a big-endian `u32` length, then that many bytes
//! (its `internal/grpcproto`). Bit 0 of the flag marks a compressed message, as in gRPC over
//! HTTP/2; bit 7, which gRPC never sets, marks a *metadata* frame whose bytes are an HTTP/1
//! header block (`Name: value\r\n` lines, Go's `http.Header.Write`, read back with
//! `textproto.ReadMIMEHeader`): the response headers (first message), then the trailers (last).
//! A metadata frame of zero length from the client, [`END_OF_STREAM`], is its half-close.
//!
//! Owns: encoding and checking those frames ([`decode`], [`encode_metadata`], [`parse_metadata`])
//! and cutting a gRPC body, whose chunks need not fall on message boundaries, into whole messages
//! ([`MessageSplitter`]), each bounded before it is buffered.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// The WebSocket subprotocol a gRPC call offers (`grpcwebsocket.SubprotocolName`); the server
/// tells such a call from any other HTTP/1.1 request by it.
pub const SUBPROTOCOL: &str = "grpc-ws";

/// Length of the prefix of every frame: flags, then the big-endian length.
pub const PREFIX_LEN: usize = 5;

/// The flag bit of a metadata (headers or trailers) frame.
const METADATA_FLAG: u8 = 0x80;
/// The flag bit of a compressed message.
const COMPRESSED_FLAG: u8 = 0x01;

/// The client's end of its request stream (`grpcproto.EndStreamHeader`).
pub const END_OF_STREAM: [u8; PREFIX_LEN] = [METADATA_FLAG, 0, 0, 0, 0];

/// One checked WebSocket message of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A gRPC message, prefix included (exactly what gRPC over HTTP/2 carries in DATA frames).
    Message(Bytes),
    /// A header block: the response headers or trailers (or, empty and from the client, its
    /// end of stream: see [`is_end_of_stream`]).
    Metadata(Bytes),
}

/// A WebSocket message that is not a well-formed frame, or a body that does not cut into them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than the prefix.
    #[error("a gRPC-WebSocket message of {0} bytes is shorter than the 5-byte frame prefix")]
    TooShort(usize),
    /// The prefix announces another length than the message has.
    #[error("a gRPC-WebSocket frame announces {declared} bytes but carries {actual}")]
    LengthMismatch {
        /// The announced length.
        declared: usize,
        /// The bytes after the prefix.
        actual: usize,
    },
    /// A metadata frame with the compression bit (grpc-http1 refuses it too).
    #[error("a compressed metadata frame (compressed headers are not supported)")]
    CompressedMetadata,
    /// A header block that is not `Name: value` lines of valid names and values.
    #[error("a malformed header block in a metadata frame: {0}")]
    BadHeaderBlock(String),
    /// A message longer than the limit of its direction.
    #[error("a gRPC message of {size} bytes is larger than the limit of {limit} bytes")]
    TooLarge {
        /// Its announced length.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A message prefix with the metadata bit inside a gRPC body (gRPC never sets it).
    #[error("a gRPC body holds a frame with the metadata flag set")]
    MetadataInBody,
    /// A body that ended inside a message.
    #[error("the gRPC body ended {missing} bytes before the end of its last message")]
    Truncated {
        /// Bytes the last message still lacked.
        missing: usize,
    },
}

/// Checks one binary WebSocket message (`grpcproto.ValidateGRPCFrame`) and tells a message from
/// metadata (`IsDataFrame` / `IsMetadataFrame`).
pub fn decode(message: Bytes) -> Result<Frame, FrameError> {
    if message.len() < PREFIX_LEN {
        return Err(FrameError::TooShort(message.len()));
    }
    let declared = declared_len(&message);
    let actual = message.len() - PREFIX_LEN;
    if declared != actual {
        return Err(FrameError::LengthMismatch { declared, actual });
    }
    if message[0] & METADATA_FLAG == 0 {
        return Ok(Frame::Message(message));
    }
    if message[0] & COMPRESSED_FLAG != 0 {
        return Err(FrameError::CompressedMetadata);
    }
    Ok(Frame::Metadata(message.slice(PREFIX_LEN..)))
}

/// Whether `message` is the client's end of stream (`grpcproto.IsEndOfStream`: exactly the five
/// bytes of [`END_OF_STREAM`]).
pub fn is_end_of_stream(message: &[u8]) -> bool {
    message == END_OF_STREAM
}

/// The length a message prefix announces (`prefix` holds at least [`PREFIX_LEN`] bytes).
fn declared_len(prefix: &[u8]) -> usize {
    u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize
}

/// `headers` as a metadata frame: `name: value\r\n` per value (Go's reader canonicalises the
/// names, so they stay lowercase here), behind the metadata prefix.
pub fn encode_metadata(headers: &HeaderMap) -> Bytes {
    let block_len: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + 2 + value.len() + 2)
        .sum();
    let mut frame = BytesMut::with_capacity(PREFIX_LEN + block_len);
    frame.put_u8(METADATA_FLAG);
    frame.put_u32(block_len as u32);
    for (name, value) in headers {
        frame.put_slice(name.as_str().as_bytes());
        frame.put_slice(b": ");
        frame.put_slice(value.as_bytes());
        frame.put_slice(b"\r\n");
    }
    frame.freeze()
}

/// The headers of a metadata frame's block (what `textproto.ReadMIMEHeader` reads: one
/// `Name: value` per line, the value's surrounding blanks trimmed, names in any case).
pub fn parse_metadata(block: &[u8]) -> Result<HeaderMap, FrameError> {
    let bad = |why: String| FrameError::BadHeaderBlock(why);
    let text = std::str::from_utf8(block).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    let mut headers = HeaderMap::new();
    for line in text.split("\r\n").filter(|l| !l.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad(format!("line {line:?} has no colon")))?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| bad(format!("{name:?} is not a header name")))?;
        let value = HeaderValue::from_str(value.trim_matches([' ', '\t']))
            .map_err(|_| bad(format!("the value of {name} is not a header value")))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Cuts a gRPC body into whole length-prefixed messages, holding at most one partial message of
/// at most `limit` bytes (a longer one is refused from its prefix, before its bytes arrive).
#[derive(Debug)]
pub struct MessageSplitter {
    buffer: BytesMut,
    limit: usize,
}

impl MessageSplitter {
    /// A splitter for messages of at most `limit` bytes (prefix not counted).
    pub fn new(limit: usize) -> Self {
        MessageSplitter {
            buffer: BytesMut::new(),
            limit,
        }
    }

    /// Adds the next chunk of the body.
    pub fn push(&mut self, chunk: impl Buf) {
        self.buffer.put(chunk);
    }

    /// The next whole message, prefix included, if the body so far holds one.
    pub fn next_message(&mut self) -> Result<Option<Bytes>, FrameError> {
        if self.buffer.len() < PREFIX_LEN {
            return Ok(None);
        }
        if self.buffer[0] & METADATA_FLAG != 0 {
            return Err(FrameError::MetadataInBody);
        }
        let size = declared_len(&self.buffer);
        if size > self.limit {
            return Err(FrameError::TooLarge {
                size,
                limit: self.limit,
            });
        }
        if self.buffer.len() < PREFIX_LEN + size {
            self.buffer.reserve(PREFIX_LEN + size - self.buffer.len());
            return Ok(None);
        }
        Ok(Some(self.buffer.split_to(PREFIX_LEN + size).freeze()))
    }

    /// Checks that the body ended on a message boundary.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.buffer.len() {
            0 => Ok(()),
            n if n < PREFIX_LEN => Err(FrameError::Truncated {
                missing: PREFIX_LEN - n,
            }),
            n => Err(FrameError::Truncated {
                missing: PREFIX_LEN + declared_len(&self.buffer) - n,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Vectors derived from grpc-http1's source (v0.5.1, golang.stackrox.io/grpc-http1), each
    //! naming the function whose behaviour it pins.
    use super::*;

    #[test]
    fn end_of_stream_is_the_metadata_flag_with_length_zero() {
        // internal/grpcproto/message_header.go: EndStreamHeader = []byte{metadataMask, 0, 0, 0, 0},
        // metadataMask = 1 << 7.
        assert_eq!(END_OF_STREAM, [0x80, 0, 0, 0, 0]);
        assert!(is_end_of_stream(&[0x80, 0, 0, 0, 0]));
        // IsEndOfStream is bytes.Equal: a longer metadata frame, or a compressed one, is not EOS.
        assert!(!is_end_of_stream(&[0x80, 0, 0, 0, 1, b'x']));
        assert!(!is_end_of_stream(&[0x81, 0, 0, 0, 0]));
        assert!(!is_end_of_stream(&[0, 0, 0, 0, 0]));
        // It is still a well-formed (empty) metadata frame for ValidateGRPCFrame.
        assert_eq!(
            decode(Bytes::from_static(&END_OF_STREAM)),
            Ok(Frame::Metadata(Bytes::new()))
        );
    }

    #[test]
    fn a_message_frame_is_the_grpc_prefix_and_payload_unchanged() {
        // internal/grpcwebsocket/write.go: the 5-byte header then `length` bytes, written as ONE
        // binary WebSocket message; flags byte with the MSB clear (IsDataFrame).
        let plain = Bytes::from_static(&[0, 0, 0, 0, 3, 0x0a, 0x01, b'x']);
        assert_eq!(decode(plain.clone()), Ok(Frame::Message(plain)));
        // The compression bit (compressionMask = 1) passes through on messages.
        let gzip = Bytes::from_static(&[1, 0, 0, 0, 2, 0x1f, 0x8b]);
        assert_eq!(decode(gzip.clone()), Ok(Frame::Message(gzip)));
        // An empty message is a valid frame (ValidateGRPCFrame only compares lengths).
        let empty = Bytes::from_static(&[0, 0, 0, 0, 0]);
        assert_eq!(decode(empty.clone()), Ok(Frame::Message(empty)));
    }

    #[test]
    fn frames_whose_length_disagrees_or_that_lack_a_prefix_are_refused() {
        // ValidateGRPCFrame: "Message length is less than the length of the header" and
        // "Declared message length (%d) does not equal actual message length (%d)".
        assert_eq!(
            decode(Bytes::from_static(&[0, 0, 0])),
            Err(FrameError::TooShort(3))
        );
        assert_eq!(
            decode(Bytes::from_static(&[0, 0, 0, 0, 4, 1, 2])),
            Err(FrameError::LengthMismatch {
                declared: 4,
                actual: 2
            })
        );
        // client/ws_proxy.go readFromServer: "compression flag is set; compressed metadata is
        // not supported".
        assert_eq!(
            decode(Bytes::from_static(&[0x81, 0, 0, 0, 0])),
            Err(FrameError::CompressedMetadata)
        );
    }

    #[test]
    fn metadata_is_an_http1_header_block_behind_the_metadata_prefix() {
        // server/websocket_writer.go WriteHeader/Close: hdr.Write(&buf), then
        // MakeMessageHeader(MetadataFlags, len) ++ buf; Go writes "Key: value\r\n" per value.
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.append("grpc-status", HeaderValue::from_static("0"));
        let frame = encode_metadata(&headers);
        let block = b"content-type: application/grpc\r\ngrpc-status: 0\r\n";
        assert_eq!(frame[0], 0x80);
        assert_eq!(&frame[1..5], &(block.len() as u32).to_be_bytes());
        assert_eq!(&frame[5..], block);
        assert_eq!(
            decode(frame),
            Ok(Frame::Metadata(Bytes::from_static(block)))
        );
    }

    #[test]
    fn a_go_written_header_block_parses_with_canonical_names_and_trimmed_values() {
        // What grpc-go's handler transport leaves in the header map when grpc-http1's writer
        // serialises it (http.Header.Write: canonical keys, sorted, "Key: value\r\n").
        let go = b"Content-Type: application/grpc\r\nGrpc-Accept-Encoding: gzip\r\n";
        let headers = parse_metadata(go).unwrap();
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["grpc-accept-encoding"], "gzip");
        // Trailers: grpc-message is percent-encoded by grpc-go, so it is a plain header value.
        let trailers =
            parse_metadata(b"Grpc-Message: token%20expired\r\nGrpc-Status:  16 \r\n").unwrap();
        assert_eq!(trailers["grpc-status"], "16");
        assert_eq!(trailers["grpc-message"], "token%20expired");
        // Repeated keys (metadata with several values) all survive.
        let multi = parse_metadata(b"X-Tag: a\r\nX-Tag: b\r\n").unwrap();
        assert_eq!(multi.get_all("x-tag").iter().count(), 2);
        // The empty block (the client's EOS, or headers with none) is no headers.
        assert!(parse_metadata(b"").unwrap().is_empty());
        assert!(matches!(
            parse_metadata(b"no colon here\r\n"),
            Err(FrameError::BadHeaderBlock(_))
        ));
        assert!(matches!(
            parse_metadata(b"Bad Name: x\r\n"),
            Err(FrameError::BadHeaderBlock(_))
        ));
    }

    #[test]
    fn a_body_is_cut_into_whole_messages_across_chunk_boundaries() {
        let mut body = Vec::new();
        for payload in [&b"first"[..], b"", b"third message"] {
            body.push(0);
            body.extend((payload.len() as u32).to_be_bytes());
            body.extend(payload);
        }
        // Byte by byte: the worst chunking a body can have.
        let mut splitter = MessageSplitter::new(64);
        let mut messages = Vec::new();
        for b in &body {
            splitter.push(&[*b][..]);
            while let Some(m) = splitter.next_message().unwrap() {
                messages.push(m);
            }
        }
        splitter.finish().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(&messages[0][5..], b"first");
        assert_eq!(messages[1].len(), PREFIX_LEN);
        assert_eq!(&messages[2][5..], b"third message");
        assert_eq!(messages.concat(), body);
    }

    #[test]
    fn a_message_over_the_limit_is_refused_from_its_prefix_and_a_truncated_body_is_an_error() {
        let mut splitter = MessageSplitter::new(16);
        splitter.push(&[0u8, 0, 0x01, 0, 0][..]);
        assert_eq!(
            splitter.next_message(),
            Err(FrameError::TooLarge {
                size: 1 << 16,
                limit: 16
            })
        );
        let mut splitter = MessageSplitter::new(16);
        splitter.push(&[0u8, 0, 0, 0, 4, b'a'][..]);
        assert_eq!(splitter.next_message(), Ok(None));
        // write.go: "fewer than the announced %d bytes" (io.ErrUnexpectedEOF).
        assert_eq!(splitter.finish(), Err(FrameError::Truncated { missing: 3 }));
        let mut splitter = MessageSplitter::new(16);
        splitter.push(&[0x80u8, 0, 0, 0, 0][..]);
        assert_eq!(splitter.next_message(), Err(FrameError::MetadataInBody));
    }
}
