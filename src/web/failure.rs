//! Why a request failed, with the status it answers: handlers return `Result<_, Failure>` and
//! the caller renders it as an error page (or JSON under `/api`). Library errors are mapped by
//! kind, so "no such group" is a 404 and a concurrent redrive a 409, never a 500.

use axum::http::StatusCode;

use crate::error::{Error, ErrorKind};

/// A refused or failed request.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub status: StatusCode,
    pub message: String,
}

impl Failure {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Failure {
        Failure { status, message: message.into() }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Failure {
        Failure::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Failure {
        Failure::new(StatusCode::NOT_FOUND, message)
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Failure {
        Failure::new(StatusCode::FORBIDDEN, message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Failure {
        Failure::new(StatusCode::UNAUTHORIZED, message)
    }
}

/// Every library error answers with the status of its kind: one match, so the same kind is the
/// same status on every route (a shutdown is 503 wherever it happens).
impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let status = match e.kind() {
            ErrorKind::InvalidInput | ErrorKind::Codec => StatusCode::BAD_REQUEST,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Deleted => StatusCode::GONE,
            ErrorKind::Conflict | ErrorKind::LeaseLost => StatusCode::CONFLICT,
            ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
            ErrorKind::Shutdown => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure::new(status, e.to_string())
    }
}
