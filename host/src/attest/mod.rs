//! Signed run records: a run record (see `record`), signed so that it can be
//! checked later, away from the daemon, by anyone holding the public key.
//!
//! A run record alone says what the daemon claims it ran; its digests let a
//! client check that the claim matches what it sent and received, but not
//! that this daemon made it. Signing closes that gap for whoever keeps the
//! records: each record becomes an in-toto Statement inside a DSSE envelope,
//! signed with an Ed25519 key the operator holds, and a bundle of them can be
//! checked offline, with our tool or with any DSSE and in-toto verifier.
//!
//! Only standard formats are used, so a checker need not trust our code:
//! - `keys`: Ed25519 keys in PEM (PKCS#8 private, SubjectPublicKeyInfo
//!   public), named by the SHA-256 of the public key's DER;
//! - `dsse`: the DSSE envelope and its pre-authentication encoding;
//! - `statement`: the in-toto Statement v1 around each predicate;
//! - `check` and `session_check`: whether a run's, or a session's, answers
//!   check against what was sent;
//! - `bundle`: what a bundle holds and how it is checked.
//!
//! The daemon holds no signing key unless the operator configures one; with
//! none, nothing is signed and run records are as before.

pub mod bundle;
pub mod check;
pub mod dsse;
pub mod error;
pub mod keys;
pub mod receipts;
pub mod session_check;
pub mod statement;

pub use error::AttestError;
