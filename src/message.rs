//! [`Message`]: what a producer sends — a payload plus optional headers.

use bytes::Bytes;

/// A message to send: an opaque payload and optional headers.
///
/// Most callers pass a payload directly (`Vec<u8>`, `&[u8]`, `&str`, `String`, [`Bytes`]); build a
/// `Message` to attach headers.
///
/// # Examples
///
/// ```
/// use rockq::Message;
///
/// let m = Message::new("charge #42").header("content-type", "text/plain");
/// assert_eq!(m.payload().as_ref(), b"charge #42");
/// assert_eq!(m.headers()[0].0, "content-type");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    pub(crate) payload: Bytes,
    pub(crate) headers: Vec<(String, Bytes)>,
}

impl Message {
    /// A message with this payload and no headers.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Message { payload: payload.into(), headers: Vec::new() }
    }

    /// Adds a header. Keys need not be unique; order is preserved. A key may be at most
    /// 65 535 bytes and a message at most 65 535 headers.
    pub fn header(mut self, key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push((key.into(), value.into()));
        self
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The headers, in insertion order.
    pub fn headers(&self) -> &[(String, Bytes)] {
        &self.headers
    }
}

impl From<Bytes> for Message {
    fn from(payload: Bytes) -> Self {
        Message::new(payload)
    }
}

impl From<Vec<u8>> for Message {
    fn from(payload: Vec<u8>) -> Self {
        Message::new(payload)
    }
}

impl From<&[u8]> for Message {
    fn from(payload: &[u8]) -> Self {
        Message::new(Bytes::copy_from_slice(payload))
    }
}

impl<const N: usize> From<&[u8; N]> for Message {
    fn from(payload: &[u8; N]) -> Self {
        Message::new(Bytes::copy_from_slice(payload))
    }
}

impl From<String> for Message {
    fn from(payload: String) -> Self {
        Message::new(payload)
    }
}

impl From<&str> for Message {
    fn from(payload: &str) -> Self {
        Message::new(Bytes::copy_from_slice(payload.as_bytes()))
    }
}
