//! Which replica holds an owner's sessions.
//!
//! The per-owner cap replaces the owner's least recently used idle session
//! when a new one opens at the cap; that needs every session of the owner
//! in view, with its turn and its last use. So an owner's sessions live
//! together: the first open makes its replica their holder (a place in
//! the owner's set in the store, renewed while the session lives), and an
//! open that reaches another replica is forwarded to that holder. The
//! holder is signed into its place, so writing the store is not enough to
//! send an owner's opens elsewhere.

use crate::quota::SessionPlace;

use super::{Replicas, settings};

/// Where an owner's new session opens.
pub enum Home {
    /// Here: the place joins the new session to the owner's set.
    Here(SessionPlace),
    /// On the replica at `url`, which holds the owner's sessions; `holder`
    /// is its entry in the set, to drop if it is found gone.
    Elsewhere { url: String, holder: String },
    /// The store did not answer.
    Unavailable,
    /// The store names a holder the replicas did not sign.
    Unsigned,
}

impl Replicas {
    /// This replica's entry among an owner's holders: its URL and a tag.
    fn owner_holder(&self, caller: &str, owner: &str) -> String {
        let tag = self.secret.sign_owner_holder(caller, owner, &self.url);
        format!("{} {tag}", self.url)
    }

    /// Joins this replica to the holders of `caller`'s `owner` sessions,
    /// unless another replica holds them.
    pub async fn owner_home(&self, caller: &str, owner: &str) -> Home {
        let me = self.owner_holder(caller, owner);
        // To its end in a task of its own: an opener who leaves cannot
        // strand a place the store gave (dropped, it is given back).
        let (store, c, o) = (self.store.clone(), caller.to_string(), owner.to_string());
        let joined = tokio::spawn(async move { store.join_owner(&c, &o, &me).await })
            .await
            .unwrap_or(Err(None));
        match joined {
            Ok((set, id)) => Home::Here(SessionPlace::new(self.store.clone(), set, id)),
            Err(None) => Home::Unavailable,
            Err(Some(holder)) => match holder.split_once(' ') {
                Some((url, tag))
                    if self.secret.verify_owner_holder(caller, owner, url, tag)
                        && settings::dialable(url) =>
                {
                    Home::Elsewhere {
                        url: url.to_string(),
                        holder,
                    }
                }
                _ => Home::Unsigned,
            },
        }
    }

    /// Drops a gone replica from an owner's holders (its sessions went
    /// with it), so the owner's next open need not wait out its leases.
    pub async fn forget_owner_holder(&self, caller: &str, owner: &str, holder: &str) {
        self.store.drop_owner_holder(caller, owner, holder).await;
    }
}
