//! The shared store's plain records, beside its bookings: a session's
//! holder (`set_for`, `get`, `del`, `release_record`), a forwarded call's
//! nonce (`record_once`), and whether the store answers (`ping`). Each is
//! one command, or one small script for a release, and none books a run.

use std::sync::Arc;

use super::RedisStore;

/// The store did not answer a plain command, or answered it with an
/// error: what was asked may or may not have happened. Its own type, so
/// a caller cannot take it for "nothing there".
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Unanswered(#[from] redis::RedisError);

impl RedisStore {
    /// Sets `key` to `value` for `ms` milliseconds (a session's holder).
    pub async fn set_for(&self, key: &str, value: &str, ms: u64) -> Result<(), Unanswered> {
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("PX")
            .arg(ms)
            .query_async::<()>(&mut conn)
            .await
            .map_err(Unanswered)
    }

    /// Records `key` for `ms` milliseconds unless it is already there, in
    /// one command, so two replicas (or two processes one after the other)
    /// cannot both see it first. True if this call recorded it. An error
    /// means the answer was lost: the key may or may not be there now.
    pub async fn record_once(&self, key: &str, ms: u64) -> Result<bool, Unanswered> {
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(key)
            .arg("1")
            .arg("NX")
            .arg("PX")
            .arg(ms.max(1))
            .query_async::<Option<String>>(&mut conn)
            .await
            .map(|set| set.is_some())
            .map_err(Unanswered)
    }

    /// Deletes `key` (`keep_ms` 0), or cuts its life to at most `keep_ms`,
    /// if it still holds `value`, what this replica wrote there
    /// (`lua/release.lua`). A store that does not answer is asked again in
    /// the background for one lease period (asking twice does no harm);
    /// after that the record expires when it was written to.
    pub async fn release_record(self: &Arc<Self>, key: &str, value: &str, keep_ms: u64) {
        if self.release_once(key, value, keep_ms).await.is_ok() {
            return;
        }
        let (key, value) = (key.to_string(), value.to_string());
        self.retry_for_a_lease(
            Some(
                "the state store did not take a record's release; it expires when it was written to",
            ),
            move |me| {
                let (key, value) = (key.clone(), value.clone());
                async move { me.release_once(&key, &value, keep_ms).await }
            },
        );
    }

    async fn release_once(
        &self,
        key: &str,
        value: &str,
        keep_ms: u64,
    ) -> Result<(), redis::RedisError> {
        let mut conn = self.conn.clone();
        self.release
            .key(key)
            .arg(value)
            .arg(keep_ms)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(|_| ())
    }

    pub async fn get(&self, key: &str) -> Result<Option<String>, Unanswered> {
        let mut conn = self.conn.clone();
        redis::cmd("GET")
            .arg(key)
            .query_async::<Option<String>>(&mut conn)
            .await
            .map_err(Unanswered)
    }

    pub async fn del(&self, key: &str) -> Result<(), Unanswered> {
        let mut conn = self.conn.clone();
        redis::cmd("DEL")
            .arg(key)
            .query_async::<()>(&mut conn)
            .await
            .map_err(Unanswered)
    }

    /// Whether the store answers.
    pub async fn ping(&self) -> Result<(), Unanswered> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(|_| ())
            .map_err(Unanswered)
    }
}
