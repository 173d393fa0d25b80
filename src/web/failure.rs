//! Why a request failed, with the status it answers: handlers return `Result<_, Failure>` and
//! the caller renders it as an error page (or JSON under `/api`). Library errors are mapped by
//! kind, so "no such group" is a 404 and a concurrent redrive a 409, never a 500.

use axum::http::StatusCode;

use crate::error::{InspectError, PauseError, QueueError, RedriveError, ResetError};

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

    fn internal(e: impl std::fmt::Display) -> Failure {
        Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }
}

impl From<InspectError> for Failure {
    fn from(e: InspectError) -> Self {
        match e {
            InspectError::NoSuchQueue(_) | InspectError::NoSuchGroup { .. } => {
                Failure::not_found(e.to_string())
            }
            InspectError::InvalidName(_) => Failure::bad_request(e.to_string()),
            InspectError::Shutdown => Failure::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            e => Failure::internal(e),
        }
    }
}

impl From<PauseError> for Failure {
    fn from(e: PauseError) -> Self {
        match e {
            PauseError::NoSuchGroup { .. } => Failure::not_found(e.to_string()),
            PauseError::InvalidName(_) => Failure::bad_request(e.to_string()),
            e => Failure::internal(e),
        }
    }
}

impl From<ResetError> for Failure {
    fn from(e: ResetError) -> Self {
        match e {
            ResetError::NoSuchGroup { .. } => Failure::not_found(e.to_string()),
            ResetError::Active { .. } => Failure::new(StatusCode::CONFLICT, e.to_string()),
            ResetError::OutOfRetention { .. } => Failure::bad_request(e.to_string()),
            e => Failure::internal(e),
        }
    }
}

impl From<RedriveError> for Failure {
    fn from(e: RedriveError) -> Self {
        match e {
            RedriveError::Conflict { .. } => Failure::new(StatusCode::CONFLICT, e.to_string()),
            RedriveError::NoOrigin { .. } | RedriveError::InvalidName(_) => {
                Failure::bad_request(e.to_string())
            }
            e => Failure::internal(e),
        }
    }
}

impl From<QueueError> for Failure {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::InvalidName(_) => Failure::bad_request(e.to_string()),
            e => Failure::internal(e),
        }
    }
}
