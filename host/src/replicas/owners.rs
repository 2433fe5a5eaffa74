//! Which replica holds an owner's sessions.
//!
//! The per-owner cap replaces the owner's least recently used idle session
//! when a new one opens at the cap; that needs every session of the owner
//! in view, with its turn and its last use. So an owner's sessions live
//! together: the first open makes its replica their holder (a place in
//! the owner's set in the store, renewed while the session lives), and an
//! open that reaches another replica is forwarded to that holder. The
//! holder is signed into its place, so writing the store is not enough to
//! send an owner's opens to an address the replicas did not sign.
//!
//! A holder is never dropped from the set on another replica's say-so: a
//! replica whose address refuses connections may still be running its
//! sessions (a firewall's reject, a balancer with no ready endpoint), and
//! dropping it would let a second replica hold the owner's sessions too.
//! A dead holder's places expire with its leases.

use crate::quota::SessionPlace;

use super::{Replicas, settings};

/// Where an owner's new session opens.
pub enum Home {
    /// Here: the place joins the new session to the owner's set.
    Here(SessionPlace),
    /// On the replica at this URL, which holds the owner's sessions.
    Elsewhere(String),
    /// The store did not answer.
    Unavailable,
    /// The store names a holder the replicas did not sign.
    Unsigned,
}

impl Replicas {
    /// Joins this replica to the holders of `caller`'s `owner` sessions,
    /// unless another replica holds them.
    pub async fn owner_home(&self, caller: &str, owner: &str) -> Home {
        let tag = self.secret.sign_owner_holder(caller, owner, &self.url);
        let me = format!("{} {tag}", self.url);
        let digest = self.secret.owner_digest(caller, owner);
        // To its end in a task of its own, and made a `SessionPlace` there:
        // an opener who leaves cannot strand a place the store gave (the
        // task's result is dropped, which gives it back).
        let (store, c) = (self.store.clone(), caller.to_string());
        let joined = tokio::spawn(async move {
            store
                .join_owner(&c, &digest, &me)
                .await
                .map(|(set, id)| SessionPlace::new(store.clone(), set, id))
        })
        .await
        .unwrap_or(Err(None));
        match joined {
            Ok(place) => Home::Here(place),
            Err(None) => Home::Unavailable,
            Err(Some(holder)) => match holder.split_once(' ') {
                Some((url, tag))
                    if self.secret.verify_owner_holder(caller, owner, url, tag)
                        && settings::dialable(url) =>
                {
                    Home::Elsewhere(url.to_string())
                }
                _ => Home::Unsigned,
            },
        }
    }
}
