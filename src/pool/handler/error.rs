//! [`HandlerError`]: a handler's failure and what to do about it; [`HandlerResultExt`]: the
//! decision on any `Result`.

use std::error::Error as StdError;
use std::time::Duration;

use crate::codec::BoxError;

/// What a handler wants done with a failed job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Retry,
    RetryAfter(Duration),
    DeadLetter,
}

/// A handler's failure, and what to do about it: retry with the group's backoff (the default,
/// and what `?` gives), retry after a given delay, or dead-letter now.
///
/// `?` converts every error into it: any `std::error::Error + Send + Sync`, a
/// `Box<dyn Error + Send + Sync>`, an `anyhow::Error` (no feature needed: anyhow converts into
/// a boxed error), a `String` or `&str`. The error's whole source chain is kept: it is the
/// text of [`message`](HandlerError::message), the retry's last error, the dead letter's
/// reason and the `error` field of the pool's tracing events (`outer: cause: root cause`).
/// [`HandlerResultExt`] picks the action on any `Result`.
///
/// Like `anyhow::Error`, this type does not implement `std::error::Error`, so that every error
/// type converts into it with `?`. To carry one through `tower` layers, whose errors are
/// boxed std errors, use [`into_boxed`](HandlerError::into_boxed).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use rockq::{HandlerError, HandlerResultExt, Task};
///
/// async fn handle(task: Task) -> Result<(), HandlerError> {
///     let text = std::str::from_utf8(task.payload()).dead_letter()?; // never valid later
///     if text == "later" {
///         return Err(HandlerError::retry_after("upstream busy", Duration::from_secs(5)));
///     }
///     let _n: u32 = text.parse()?; // a parse error retries with backoff
///     Ok(())
/// }
/// ```
pub struct HandlerError {
    pub(crate) action: Action,
    /// The rendered chain: what every consumer of the error shows.
    message: String,
    source: Option<BoxError>,
}

impl HandlerError {
    /// The kind of this error: always [`ErrorKind::Handler`](crate::ErrorKind::Handler).
    ///
    /// # Examples
    ///
    /// ```
    /// let e = rockq::HandlerError::retry("payment provider down");
    /// assert_eq!(e.kind(), rockq::ErrorKind::Handler);
    /// ```
    pub fn kind(&self) -> crate::error::ErrorKind {
        crate::error::ErrorKind::Handler
    }

    /// Retry with the group's backoff (dead-letter once attempts are used up).
    ///
    /// # Examples
    ///
    /// ```
    /// let e = rockq::HandlerError::retry("database unavailable");
    /// assert_eq!(e.message(), "database unavailable");
    /// ```
    pub fn retry(message: impl std::fmt::Display) -> Self {
        HandlerError { action: Action::Retry, message: message.to_string(), source: None }
    }

    /// Retry after exactly `delay` (dead-letter once attempts are used up). A `delay` over 100
    /// years is clamped to 100 years.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = rockq::HandlerError::retry_after("rate limited", std::time::Duration::from_secs(60));
    /// ```
    pub fn retry_after(message: impl std::fmt::Display, delay: Duration) -> Self {
        HandlerError::retry(message).with_action(Action::RetryAfter(crate::clock::clamp_delay(delay)))
    }

    /// Do not retry: dead-letter now.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = rockq::HandlerError::dead_letter("order 7 does not exist");
    /// ```
    pub fn dead_letter(message: impl std::fmt::Display) -> Self {
        HandlerError::retry(message).with_action(Action::DeadLetter)
    }

    /// Wraps `error` (its source chain kept), to be retried with the group's backoff; change
    /// the action with [`HandlerResultExt`] or [`into_dead_letter`](HandlerError::into_dead_letter).
    ///
    /// # Examples
    ///
    /// ```
    /// let io = std::io::Error::other("disk full");
    /// let e = rockq::HandlerError::from_error(io);
    /// assert_eq!(e.message(), "disk full");
    /// ```
    pub fn from_error(error: impl Into<BoxError>) -> Self {
        let source = error.into();
        // A HandlerError carried through tower layers comes back as itself.
        let source = match source.downcast::<Carried>() {
            Ok(carried) => return carried.0,
            Err(other) => other,
        };
        HandlerError { action: Action::Retry, message: render_chain(&*source), source: Some(source) }
    }

    /// The same error, dead-lettered now instead.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = rockq::HandlerError::from_error(std::io::Error::other("bad magic bytes"));
    /// assert!(!e.is_dead_letter());
    /// let e = e.into_dead_letter();
    /// assert!(e.is_dead_letter());
    /// assert_eq!(e.message(), "bad magic bytes");
    /// ```
    pub fn into_dead_letter(self) -> Self {
        self.with_action(Action::DeadLetter)
    }

    fn with_action(mut self, action: Action) -> Self {
        self.action = action;
        self
    }

    /// The error text with its source chain, `outer: cause: root cause`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(rockq::HandlerError::retry("upstream 503").message(), "upstream 503");
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The wrapped error, if it was made from one (for downcasting).
    ///
    /// # Examples
    ///
    /// ```
    /// let e = rockq::HandlerError::from_error(std::io::Error::other("disk full"));
    /// let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>()).unwrap();
    /// assert_eq!(io.kind(), std::io::ErrorKind::Other);
    /// assert!(rockq::HandlerError::retry("no source").source().is_none());
    /// ```
    pub fn source(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        self.source.as_deref()
    }

    /// Whether it asks for a dead letter rather than a retry.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(rockq::HandlerError::dead_letter("malformed").is_dead_letter());
    /// assert!(!rockq::HandlerError::retry("timeout").is_dead_letter());
    /// ```
    pub fn is_dead_letter(&self) -> bool {
        self.action == Action::DeadLetter
    }

    /// This error as a boxed `std::error::Error`, for `tower` services (whose layers box
    /// errors): a `tower`-feature handler turns it back into this error, action included.
    ///
    /// # Examples
    ///
    /// ```
    /// let boxed: Box<dyn std::error::Error + Send + Sync> = rockq::HandlerError::dead_letter("bad").into_boxed();
    /// assert_eq!(boxed.to_string(), "bad");
    /// ```
    pub fn into_boxed(self) -> BoxError {
        Box::new(Carried(self))
    }
}

/// `outer: cause: root cause`, each level once (wrappers that repeat their source's text, as
/// some do in Display, are not shown twice).
fn render_chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

impl std::fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HandlerError({:?}, {:?})", self.action, self.message)
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: Into<BoxError>> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError::from_error(e)
    }
}

/// A [`HandlerError`] boxed as a std error (see [`HandlerError::into_boxed`]).
struct Carried(HandlerError);

impl std::fmt::Debug for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl StdError for Carried {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source.as_deref().map(|e| e as &(dyn StdError + 'static))
    }
}

/// Chooses what a failed job gets, on any `Result` whose error converts into a boxed error
/// (std errors, `anyhow::Error`, strings): underway's `ToTaskResult`, for rockq.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use rockq::{HandlerError, HandlerResultExt, Task};
///
/// async fn handle(task: Task) -> Result<(), HandlerError> {
///     let id: u64 = std::str::from_utf8(task.payload()).dead_letter()?.parse().dead_letter()?;
///     let _row = lookup(id).retry_after(Duration::from_secs(10))?;
///     Ok(())
/// }
/// # fn lookup(_: u64) -> Result<(), std::io::Error> { Ok(()) }
/// ```
pub trait HandlerResultExt<T> {
    /// On error: retry with the group's backoff (what `?` does anyway).
    ///
    /// # Errors
    ///
    /// The error, as a [`HandlerError`] that retries.
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::HandlerResultExt;
    /// let e = "x".parse::<u32>().retry().unwrap_err();
    /// assert!(!e.is_dead_letter());
    /// ```
    fn retry(self) -> Result<T, HandlerError>;

    /// On error: retry after exactly `delay`.
    ///
    /// # Errors
    ///
    /// The error, as a [`HandlerError`] that retries after `delay`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use rockq::HandlerResultExt;
    /// let r: Result<(), std::io::Error> = Err(std::io::Error::other("rate limited"));
    /// let e = r.retry_after(Duration::from_secs(30)).unwrap_err();
    /// assert_eq!(e.message(), "rate limited");
    /// ```
    fn retry_after(self, delay: Duration) -> Result<T, HandlerError>;

    /// On error: dead-letter now, with the error's chain as the reason.
    ///
    /// # Errors
    ///
    /// The error, as a [`HandlerError`] that dead-letters.
    ///
    /// # Examples
    ///
    /// ```
    /// use rockq::HandlerResultExt;
    /// let e = "x".parse::<u32>().dead_letter().unwrap_err();
    /// assert!(e.is_dead_letter());
    /// ```
    fn dead_letter(self) -> Result<T, HandlerError>;
}

impl<T, E: Into<BoxError>> HandlerResultExt<T> for Result<T, E> {
    fn retry(self) -> Result<T, HandlerError> {
        self.map_err(HandlerError::from_error)
    }

    fn retry_after(self, delay: Duration) -> Result<T, HandlerError> {
        self.map_err(|e| {
            HandlerError::from_error(e).with_action(Action::RetryAfter(crate::clock::clamp_delay(delay)))
        })
    }

    fn dead_letter(self) -> Result<T, HandlerError> {
        self.map_err(|e| HandlerError::from_error(e).into_dead_letter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("loading order 7")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn the_source_chain_is_kept_in_the_message() {
        let e: HandlerError = Outer(std::io::Error::other("disk full")).into();
        assert_eq!(e.message(), "loading order 7: disk full");
        assert!(!e.is_dead_letter());
        assert!(e.source().is_some_and(|s| s.downcast_ref::<Outer>().is_some()));
    }

    #[test]
    fn the_result_extension_sets_the_action() {
        let r: Result<(), std::io::Error> = Err(std::io::Error::other("x"));
        assert!(r.dead_letter().unwrap_err().is_dead_letter());
        let r: Result<(), &str> = Err("busy");
        let e = r.retry_after(Duration::from_secs(3)).unwrap_err();
        assert_eq!(e.action, Action::RetryAfter(Duration::from_secs(3)));
        assert_eq!(e.message(), "busy");
    }

    #[test]
    fn a_boxed_handler_error_comes_back_with_its_action() {
        let boxed = HandlerError::dead_letter("poison").into_boxed();
        let back = HandlerError::from_error(boxed);
        assert!(back.is_dead_letter());
        assert_eq!(back.message(), "poison");
    }
}
