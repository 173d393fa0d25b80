//! Typed payloads: the [`Codec`] trait, the JSON and postcard codecs, and [`DecodeError`].
//!
//! A typed send stamps the codec's [name](Codec::NAME) in the [`CODEC_HEADER`] header, so a
//! consumer decodes with the codec the producer used ([`Delivery::decode`](crate::Delivery::decode),
//! [`Task::decode`](crate::Task::decode)) and a payload written by one codec is never misread by
//! another.

use std::error::Error as StdError;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The header a typed send stamps with its codec's [name](Codec::NAME).
pub const CODEC_HEADER: &str = "rockq-codec";

/// A boxed error, as codecs return them.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Turns values into payloads and back: [`Json`] (feature `json`, on by default) and
/// [`Postcard`] (feature `postcard`). Implement it to bring another format; its
/// [`NAME`](Codec::NAME) is stamped in each message's [`CODEC_HEADER`] header.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "json")] {
/// use rockq::{Codec, Json};
///
/// let bytes = Json.encode(&vec![1, 2, 3]).unwrap();
/// assert_eq!(bytes, b"[1,2,3]");
/// let back: Vec<u32> = Json.decode(&bytes).unwrap();
/// assert_eq!(back, [1, 2, 3]);
/// # }
/// ```
pub trait Codec: Clone + Send + Sync + 'static {
    /// The name stamped in the [`CODEC_HEADER`] header (short, ASCII, unique per format).
    const NAME: &'static str;

    /// Encodes `value`.
    ///
    /// # Errors
    ///
    /// The format's error when `value` cannot be represented (e.g. a map with non-string keys
    /// in JSON).
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::{Codec, Json};
    /// assert_eq!(Json.encode(&("a", 1)).unwrap(), br#"["a",1]"#);
    /// ```
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError>;

    /// Decodes a `T` from `bytes`.
    ///
    /// # Errors
    ///
    /// The format's error when `bytes` is not a valid `T`.
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::{Codec, Json};
    /// let pair: (String, u8) = Json.decode(br#"["a",1]"#).unwrap();
    /// assert_eq!(pair, ("a".to_string(), 1));
    /// assert!(Json.decode::<u8>(b"not json").is_err());
    /// ```
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// JSON through `serde_json` (feature `json`, on by default): readable in the CLI, the console
/// and from other languages. Also the codec assumed for a payload without a codec header.
#[cfg(feature = "json")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Json;

#[cfg(feature = "json")]
impl Codec for Json {
    const NAME: &'static str = "json";

    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(value)?)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Compact binary through `postcard` (feature `postcard`): a stable, documented wire format,
/// typically a third to a half of the JSON size. Not self-describing: producer and consumer
/// must agree on the type (add fields at the end, as `Option`s, to evolve it).
#[cfg(feature = "postcard")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Postcard;

#[cfg(feature = "postcard")]
impl Codec for Postcard {
    const NAME: &'static str = "postcard";

    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(postcard::to_stdvec(value)?)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(postcard::from_bytes(bytes)?)
    }
}

/// A payload did not decode as the requested type. Returned by the `decode` methods; a worker
/// pool's [`run_typed`](crate::Workers::run_typed) dead-letters such a message at once with
/// this error as the reason, and a typed ordered stream
/// ([`Subscription::decoded`](crate::Subscription::decoded)) yields it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{queue:?} #{seq}: payload does not decode as {type_name} with codec {codec:?}: {source}")]
pub struct DecodeError {
    queue: String,
    seq: u64,
    codec: String,
    type_name: &'static str,
    /// Shared, so that the error clones (as every rockq error does).
    #[source]
    source: std::sync::Arc<dyn StdError + Send + Sync + 'static>,
}

/// Whether a decode failed for want of the codec (unknown name, or its feature off), which a
/// fixed deployment can decode, or on the payload itself, which nothing ever will.
impl DecodeError {
    /// Whether the codec the message names is unknown to this build (not compiled in, or
    /// misspelt): the payload itself may be fine, and a build with the codec can decode it.
    /// Typed pools retry such messages and typed streams stop at them, instead of
    /// dead-lettering them.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(delivery: rockq::Delivery) {
    /// if let Err(e) = delivery.decode::<u64>() {
    ///     if e.is_unknown_codec() {
    ///         eprintln!("deploy a build with codec {}", e.codec());
    ///     }
    /// }
    /// # }
    /// ```
    pub fn is_unknown_codec(&self) -> bool {
        self.source.is::<UnknownCodec>()
    }
}

impl DecodeError {
    pub(crate) fn new(queue: &str, seq: u64, codec: &str, type_name: &'static str, source: BoxError) -> Self {
        DecodeError {
            queue: queue.to_owned(),
            seq,
            codec: codec.to_owned(),
            type_name,
            source: source.into(),
        }
    }

    /// The queue of the message.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task) {
    /// if let Err(e) = task.decode::<Vec<u64>>() {
    ///     eprintln!("{}#{} is not {} in {}", e.queue(), e.seq(), e.type_name(), e.codec());
    /// }
    /// # }
    /// ```
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The message's sequence.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task) {
    /// if let Err(e) = task.decode::<Vec<u64>>() {
    ///     assert_eq!(e.seq(), task.seq());
    /// }
    /// # }
    /// ```
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The codec named by the message's header (or the one assumed without a header).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task) {
    /// if let Err(e) = task.decode::<Vec<u64>>() {
    ///     eprintln!("payload is not valid {}", e.codec()); // e.g. "json"
    /// }
    /// # }
    /// ```
    pub fn codec(&self) -> &str {
        &self.codec
    }

    /// The Rust type it was decoded as.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(task: rockq::Task) {
    /// if let Err(e) = task.decode::<Vec<u64>>() {
    ///     assert_eq!(e.type_name(), std::any::type_name::<Vec<u64>>());
    /// }
    /// # }
    /// ```
    pub fn type_name(&self) -> &'static str {
        self.type_name
    }
}

/// Unknown or disabled codec named by a header.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct UnknownCodec(String);

/// Decodes `payload` with the codec its [`CODEC_HEADER`] names (JSON without a header).
pub(crate) fn decode_stamped<T: DeserializeOwned>(
    queue: &str,
    seq: u64,
    codec: Option<&[u8]>,
    payload: &[u8],
) -> Result<T, DecodeError> {
    let name = match codec {
        None => "json".to_owned(),
        Some(raw) => String::from_utf8_lossy(raw).into_owned(),
    };
    let fail = |e: BoxError| DecodeError::new(queue, seq, &name, std::any::type_name::<T>(), e);
    // Without any codec feature nothing reads the payload.
    let _ = payload;
    let result: Result<T, BoxError> = match name.as_str() {
        #[cfg(feature = "json")]
        "json" => Json.decode(payload),
        #[cfg(feature = "postcard")]
        "postcard" => Postcard.decode(payload),
        other => Err(Box::new(UnknownCodec(format!(
            "unknown codec {other:?} (known: {}); enable its feature or use decode_with",
            known().join(", ")
        )))),
    };
    result.map_err(fail)
}

/// Decodes `payload` with `codec`, whatever the header says.
pub(crate) fn decode_with<T: DeserializeOwned, C: Codec>(
    queue: &str,
    seq: u64,
    codec: &C,
    payload: &[u8],
) -> Result<T, DecodeError> {
    codec.decode(payload).map_err(|e| DecodeError::new(queue, seq, C::NAME, std::any::type_name::<T>(), e))
}

fn known() -> Vec<&'static str> {
    [cfg!(feature = "json").then_some("json"), cfg!(feature = "postcard").then_some("postcard")]
        .into_iter()
        .flatten()
        .collect()
}

#[cfg(all(test, feature = "json"))]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Order {
        id: u64,
        item: String,
    }

    #[test]
    fn a_payload_decodes_with_the_codec_its_header_names() {
        let o = Order { id: 7, item: "tea".into() };
        let bytes = Json.encode(&o).unwrap();
        let back: Order = decode_stamped("q", 1, Some(b"json"), &bytes).unwrap();
        assert_eq!(back, o);
        let headerless: Order = decode_stamped("q", 1, None, &bytes).unwrap();
        assert_eq!(headerless, o);
    }

    #[test]
    fn an_unknown_codec_or_a_bad_payload_is_a_decode_error_naming_both() {
        let e = decode_stamped::<Order>("q", 3, Some(b"xml"), b"<o/>").unwrap_err();
        assert_eq!((e.queue(), e.seq(), e.codec()), ("q", 3, "xml"));
        assert!(e.to_string().contains("unknown codec \"xml\""), "{e}");
        let e = decode_stamped::<Order>("q", 4, Some(b"json"), b"{\"id\":1}").unwrap_err();
        assert!(e.to_string().contains("missing field `item`"), "{e}");
        assert!(e.type_name().ends_with("Order"));
    }

    #[cfg(feature = "postcard")]
    #[test]
    fn postcard_round_trips_and_is_smaller_than_json() {
        let o = Order { id: 300, item: "green tea".into() };
        let bin = Postcard.encode(&o).unwrap();
        assert!(bin.len() < Json.encode(&o).unwrap().len());
        let back: Order = decode_stamped("q", 1, Some(b"postcard"), &bin).unwrap();
        assert_eq!(back, o);
        // JSON bytes are not postcard: the header decides, not a guess.
        assert!(decode_stamped::<Order>("q", 1, Some(b"postcard"), &Json.encode(&o).unwrap()).is_err());
    }
}
