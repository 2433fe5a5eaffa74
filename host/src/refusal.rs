//! Typed refusals: the statement that nothing ran, and why.
//!
//! Every answer that did not dispatch the run carries one of these reasons, as
//! a `plimsoll.v1.NotDispatched` error detail and as the
//! `Plimsoll-Not-Dispatched` header. An error *without* the mark means the code
//! may have run, and a client must never retry it blindly, so a refusal is
//! only ever built on paths where the provider was not called.

use std::fmt;

/// `plimsoll.v1.NotDispatchedReason`, numbered as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Request = 1,
    Permission = 2,
    Protocol = 3,
    Unsupported = 4,
    Isolation = 5,
    Capacity = 6,
    Environment = 7,
}

impl Reason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Request => "request",
            Reason::Permission => "permission",
            Reason::Protocol => "protocol",
            Reason::Unsupported => "unsupported",
            Reason::Isolation => "isolation",
            Reason::Capacity => "capacity",
            Reason::Environment => "environment",
        }
    }

    /// The reason a `Plimsoll-Not-Dispatched` header names (another
    /// replica's answer, read back); None for a name that is not one.
    pub fn from_name(name: &str) -> Option<Reason> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// The reason a `NotDispatched` detail numbers; None for 0 (unspecified)
    /// or a number this build does not know.
    pub fn from_number(n: u8) -> Option<Reason> {
        Self::ALL.into_iter().find(|r| *r as u8 == n)
    }

    const ALL: [Reason; 7] = [
        Reason::Request,
        Reason::Permission,
        Reason::Protocol,
        Reason::Unsupported,
        Reason::Isolation,
        Reason::Capacity,
        Reason::Environment,
    ];

    /// The protobuf encoding of `NotDispatched { reason }`: field 1, varint.
    /// Every reason number is below 128, so it is always two bytes.
    pub const fn detail_bytes(self) -> [u8; 2] {
        [0x08, self as u8]
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Connect error codes this daemon answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    DeadlineExceeded,
}

impl Code {
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::Unauthenticated => "unauthenticated",
            Code::PermissionDenied => "permission_denied",
            Code::NotFound => "not_found",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
        }
    }

    /// The code a Connect error's `code` field names; None for another.
    pub fn from_name(name: &str) -> Option<Code> {
        [
            Code::InvalidArgument,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::NotFound,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
            Code::DeadlineExceeded,
        ]
        .into_iter()
        .find(|c| c.as_str() == name)
    }

    /// The HTTP status Connect pairs with each code.
    pub const fn http_status(self) -> u16 {
        match self {
            Code::InvalidArgument => 400,
            Code::Unauthenticated => 401,
            Code::PermissionDenied => 403,
            Code::NotFound => 404,
            Code::ResourceExhausted => 429,
            Code::FailedPrecondition => 400,
            Code::Unimplemented => 501,
            Code::Internal => 500,
            Code::Unavailable => 503,
            Code::DeadlineExceeded => 504,
        }
    }
}

/// A refusal: nothing ran. The message goes to the caller only; it must not
/// contain anything the caller did not send or is not entitled to see.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?} ({reason}): {message}")]
pub struct Refusal {
    pub code: Code,
    pub reason: Reason,
    pub message: String,
}

impl Refusal {
    pub fn new(code: Code, reason: Reason, message: impl Into<String>) -> Self {
        Refusal {
            code,
            reason,
            message: message.into(),
        }
    }

    /// A malformed or out-of-bounds request.
    pub fn request(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, Reason::Request, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, Reason::Unsupported, message)
    }

    pub fn capacity(message: impl Into<String>) -> Self {
        Self::new(Code::ResourceExhausted, Reason::Capacity, message)
    }

    pub fn environment(message: impl Into<String>) -> Self {
        Self::new(Code::FailedPrecondition, Reason::Environment, message)
    }

    pub fn permission(message: impl Into<String>) -> Self {
        Self::new(Code::PermissionDenied, Reason::Permission, message)
    }
}
