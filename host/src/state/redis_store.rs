//! The shared store: Redis, for several replicas behind one address.
//!
//! Every check-and-book is one Lua script run on the server (`lua/`), so no
//! replica reads, decides and writes while another does the same; a run
//! costs two round trips (admit, settle), a session call one (its rate).
//! A run's concurrency place is a lease with an expiry in the server's
//! clock, renewed by the replica that holds it while the run lasts: a
//! replica that dies stops renewing, and its places free themselves.
//!
//! When the store cannot be reached, nothing is admitted uncounted: the
//! run is refused (`capacity`, marked: nothing ran) and readiness fails.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{Ask, Booked};

mod records;
use crate::limits::{QuotaSettings, Shed};
pub use records::Unanswered;

/// How long one call to the store may take before the run is refused.
const TIMEOUT: Duration = Duration::from_secs(1);
/// Between attempts to give back a run's lease the store did not take.
const RETRY: Duration = Duration::from_millis(250);

/// The fleet's paid seconds; `*` is never a caller's ID.
const FLEET_PAID: &str = "plimsoll:paid:*";

pub struct RedisStore {
    conn: ConnectionManager,
    lease: Duration,
    /// This replica's prefix for its lease IDs, random per start.
    replica: String,
    next: AtomicU64,
    /// Leases this replica holds (lease ID -> the sorted set it is in),
    /// renewed until given back: a caller's runs, and a caller's sessions.
    live: Mutex<HashMap<String, Held>>,
    /// Held across a renewal, and waited for by a release: a renewal that
    /// read a lease before its release must reach the store first, or it
    /// would put back a lease the release had just given back.
    renewing: tokio::sync::Mutex<()>,
    admit: Script,
    charge: Script,
    settle: Script,
    renew: Script,
    place: Script,
    owner: Script,
    release: Script,
}

/// A lease this replica renews, and the sorted set it is in.
#[derive(Clone)]
enum Held {
    Run(String),
    Session(String),
}

impl Held {
    fn set(&self) -> &str {
        match self {
            Held::Run(s) | Held::Session(s) => s,
        }
    }
}

fn leases(caller: &str) -> String {
    format!("plimsoll:lease:{caller}")
}
fn bucket(caller: &str) -> String {
    format!("plimsoll:rate:{caller}")
}
fn paid(caller: &str) -> String {
    format!("plimsoll:paid:{caller}")
}
fn sessions(caller: &str) -> String {
    format!("plimsoll:sessions:{caller}")
}
/// An owner's sessions across the fleet, by the owner's keyed digest (the
/// owner is a name the caller chose, perhaps a user's: the store never
/// holds it, nor a digest anyone can check a guess against).
fn owner_sessions(caller: &str, owner_digest: &str) -> String {
    format!("plimsoll:owner:{caller}:{owner_digest}")
}
fn booking(id: &str) -> String {
    format!("plimsoll:booking:{id}")
}

/// A script with the helpers it shares with the others in front of it
/// (Redis runs each script alone: there is no module to import).
fn with_prelude(body: &str) -> Script {
    Script::new(&format!("{}{body}", include_str!("lua/bucket.lua")))
}

/// What a booking script's verdict (`lua/admit.lua`, `lua/charge.lua`)
/// means, read in one place for both: a verdict this build does not know
/// is the store not answering as it should, whichever script gave it.
fn verdict_of(verdict: &str) -> Result<(), Shed> {
    match verdict {
        "ok" => Ok(()),
        "per_key" => Err(Shed::PerKey),
        "rate" => Err(Shed::Rate),
        "paid_caller" => Err(Shed::PaidCaller),
        "paid_daemon" => Err(Shed::PaidDaemon),
        other => {
            tracing::error!(
                verdict = other,
                "the state store answered an unknown verdict"
            );
            Err(Shed::StoreUnavailable)
        }
    }
}

fn unreachable(e: &redis::RedisError) -> Shed {
    tracing::warn!(error = %e, "the state store did not answer; the run is refused");
    Shed::StoreUnavailable
}

impl RedisStore {
    /// A store over `url`, connected on first use (a replica starts, and
    /// says it is not ready, while the store is down), with the renewal of
    /// its leases running in the current runtime.
    pub fn connect(url: &str, lease: Duration) -> Result<Arc<RedisStore>, String> {
        // The URL is not echoed in errors: it may carry the password.
        // Every exchange is one small request and its answer: Nagle's
        // algorithm would only hold requests back.
        let info = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(|_| "PLIMSOLL_STATE_URL is not usable".to_string())?
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(info)
            .map_err(|_| "PLIMSOLL_STATE_URL is not usable".to_string())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| format!("the state store's client: {e}"))?;
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).map_err(|e| format!("no randomness: {e}"))?;
        let store = Arc::new(RedisStore {
            conn,
            lease,
            replica: hex::encode(id),
            next: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
            renewing: tokio::sync::Mutex::new(()),
            admit: with_prelude(include_str!("lua/admit.lua")),
            charge: with_prelude(include_str!("lua/charge.lua")),
            settle: Script::new(include_str!("lua/settle.lua")),
            renew: with_prelude(include_str!("lua/renew.lua")),
            place: with_prelude(include_str!("lua/place.lua")),
            owner: with_prelude(include_str!("lua/owner.lua")),
            release: Script::new(include_str!("lua/release.lua")),
        });
        tokio::spawn(renew_while_alive(Arc::downgrade(&store)));
        Ok(store)
    }

    pub async fn admit(
        self: &Arc<Self>,
        settings: &QuotaSettings,
        ask: &Ask<'_>,
    ) -> Result<Booked, Shed> {
        let reserve = if settings.metered { ask.reserve } else { 0 };
        let leased = settings.per_caller_concurrency > 0;
        let id = format!(
            "{}-{}",
            self.replica,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let allowance = ask
            .paid_allowance
            .map_or(-1i64, |a| i64::try_from(a).unwrap_or(i64::MAX));
        let mut conn = self.conn.clone();
        let answer: Result<(String, u64), _> = self
            .admit
            .key(leases(ask.caller))
            .key(bucket(ask.caller))
            .key(paid(ask.caller))
            .key(FLEET_PAID)
            .key(booking(&id))
            .arg(&id)
            .arg(self.lease.as_millis() as u64)
            .arg(settings.per_caller_concurrency)
            .arg(settings.rate_per_min)
            .arg(settings.burst.max(1))
            .arg(u8::from(settings.metered))
            .arg(allowance)
            .arg(settings.daemon_paid_seconds_per_day)
            .arg(reserve)
            .invoke_async(&mut conn)
            .await;
        let (verdict, day) = match answer {
            Ok(a) => a,
            Err(e) => {
                // The script may have run and only its answer been lost:
                // undo whatever it booked (settling a booking that does not
                // exist does nothing), so nothing stays held for a run
                // that was refused.
                let undo = Booked {
                    id: Some(id),
                    leased,
                    day: 0,
                    reserved: reserve,
                };
                self.settle_in_background(ask.caller.to_string(), undo, reserve);
                return Err(unreachable(&e));
            }
        };
        verdict_of(&verdict)?;
        if leased {
            self.keep_renewing(&id, Held::Run(leases(ask.caller)));
        }
        Ok(Booked {
            id: Some(id),
            leased,
            day,
            reserved: reserve,
        })
    }

    pub async fn charge(&self, settings: &QuotaSettings, caller: &str) -> Result<(), Shed> {
        if settings.rate_per_min == 0 {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let verdict: String = self
            .charge
            .key(bucket(caller))
            .arg(settings.rate_per_min)
            .arg(settings.burst.max(1))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| unreachable(&e))?;
        verdict_of(&verdict)
    }

    /// Stops renewing a booking's lease: from here it expires unless a
    /// release reaches the store first. Synchronous, so a slot dropped
    /// anywhere stops holding its place.
    pub fn forget(&self, booked: &Booked) {
        if let Some(id) = &booked.id
            && let Ok(mut live) = self.live.lock()
        {
            live.remove(id);
        }
    }

    /// Gives back the lease and refunds `refund` seconds (at most what was
    /// booked, and at most once: see `lua/settle.lua`). A first attempt
    /// that fails (the store restarting, a connection broken under it) is
    /// retried in the background until the lease would have expired
    /// anyway, so the run's answer does not wait for it.
    pub async fn release(self: &Arc<Self>, caller: &str, booked: &Booked, refund: u64) {
        self.forget(booked);
        if !booked.leased && booked.reserved == 0 {
            return;
        }
        // A renewal that read this lease before it was forgotten reaches
        // the store before this release does.
        drop(self.renewing.lock().await);
        if self.settle_once(caller, booked, refund).await.is_ok() {
            return;
        }
        self.settle_in_background(caller.to_string(), booked.clone(), refund);
    }

    fn settle_in_background(self: &Arc<Self>, caller: String, booked: Booked, refund: u64) {
        // If it never lands, the lease expires on its own; the refund is
        // lost, which errs towards the caller having used more, never less.
        self.retry_for_a_lease(
            Some("the state store did not take a run's release; its lease expires"),
            move |me| {
                let (caller, booked) = (caller.clone(), booked.clone());
                async move { me.settle_once(&caller, &booked, refund).await }
            },
        );
    }

    /// Asks the store again, in the background, every `RETRY` for one lease
    /// period (after which what was asked expires by itself), until
    /// `attempt` succeeds; `gave_up` is logged if it never does. Asking
    /// twice does no harm for anything sent through here.
    fn retry_for_a_lease<F, Fut>(self: &Arc<Self>, gave_up: Option<&'static str>, attempt: F)
    where
        F: Fn(Arc<Self>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), redis::RedisError>> + Send,
    {
        let me = self.clone();
        tokio::spawn(async move {
            let give_up = tokio::time::Instant::now() + me.lease;
            loop {
                tokio::time::sleep(RETRY).await;
                match attempt(me.clone()).await {
                    Ok(()) => return,
                    Err(e) if tokio::time::Instant::now() >= give_up => {
                        if let Some(why) = gave_up {
                            tracing::warn!(error = %e, "{why}");
                        }
                        return;
                    }
                    Err(_) => {}
                }
            }
        });
    }

    async fn settle_once(
        &self,
        caller: &str,
        booked: &Booked,
        refund: u64,
    ) -> Result<(), redis::RedisError> {
        let id = booked.id.as_deref().unwrap_or("");
        let mut conn = self.conn.clone();
        self.settle
            .key(leases(caller))
            .key(paid(caller))
            .key(FLEET_PAID)
            .key(booking(id))
            .arg(id)
            .arg(booked.day)
            .arg(refund)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(|_| ())
    }

    /// Takes one of a caller's `cap` session places across the fleet: a
    /// lease like a run's, renewed while the session is open, so a dead
    /// replica's sessions stop counting within one lease period. Returns
    /// the place's ID, or None at the cap.
    pub async fn take_session_place(
        self: &Arc<Self>,
        caller: &str,
        cap: u32,
    ) -> Result<Option<(String, String)>, Shed> {
        let id = format!(
            "{}-s{}",
            self.replica,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let set = sessions(caller);
        let mut conn = self.conn.clone();
        let taken: Result<i64, _> = self
            .place
            .key(&set)
            .arg(&id)
            .arg(self.lease.as_millis() as u64)
            .arg(cap)
            .invoke_async(&mut conn)
            .await;
        match taken {
            Ok(1) => {
                self.keep_renewing(&id, Held::Session(set.clone()));
                Ok(Some((set, id)))
            }
            Ok(_) => Ok(None),
            Err(e) => {
                // It may have been taken: give it back in the background.
                self.give_back_place_later(set, id);
                Err(unreachable(&e))
            }
        }
    }

    /// Joins this replica (`holder`, its signed address) to the replicas
    /// holding `owner`'s sessions, if no other one holds any: an owner's
    /// sessions live on one replica, so its per-owner cap (and the choice
    /// of which idle session to replace) is that replica's alone.
    /// `Ok((set, place))`: joined, with a place renewed like a session's;
    /// `Err(Some(other))`: another holder has them.
    pub async fn join_owner(
        self: &Arc<Self>,
        caller: &str,
        owner_digest: &str,
        holder: &str,
    ) -> Result<(String, String), Option<String>> {
        let set = owner_sessions(caller, owner_digest);
        let id = format!(
            "{}-o{} {holder}",
            self.replica,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = self.conn.clone();
        let joined: Result<String, _> = self
            .owner
            .key(&set)
            .arg(&id)
            .arg(self.lease.as_millis() as u64)
            .arg(holder)
            .invoke_async(&mut conn)
            .await;
        match joined {
            Ok(other) if other.is_empty() => {
                self.keep_renewing(&id, Held::Session(set.clone()));
                Ok((set, id))
            }
            Ok(other) => Err(Some(other)),
            Err(e) => {
                self.give_back_place_later(set, id);
                let _ = unreachable(&e);
                Err(None)
            }
        }
    }

    /// Gives a session place back (the session ended).
    pub async fn give_back_place(self: &Arc<Self>, set: &str, id: &str) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(id);
        }
        drop(self.renewing.lock().await);
        let mut conn = self.conn.clone();
        let done = redis::cmd("ZREM")
            .arg(set)
            .arg(id)
            .query_async::<i64>(&mut conn)
            .await;
        if done.is_err() {
            self.give_back_place_later(set.to_string(), id.to_string());
        }
    }

    /// Renews the lease `id` in its set until it is given back.
    fn keep_renewing(&self, id: &str, held: Held) {
        if let Ok(mut live) = self.live.lock() {
            live.insert(id.to_string(), held);
        }
    }

    /// Stops renewing a session place; it expires unless given back first.
    pub fn forget_place(&self, id: &str) {
        if let Ok(mut live) = self.live.lock() {
            live.remove(id);
        }
    }

    fn give_back_place_later(self: &Arc<Self>, set: String, id: String) {
        self.retry_for_a_lease(None, move |me| {
            let (set, id) = (set.clone(), id.clone());
            async move {
                let mut conn = me.conn.clone();
                redis::cmd("ZREM")
                    .arg(&set)
                    .arg(&id)
                    .query_async::<i64>(&mut conn)
                    .await
                    .map(|_| ())
            }
        });
    }

    async fn renew(&self) {
        let _renewing = self.renewing.lock().await;
        let held: Vec<(String, Held)> = match self.live.lock() {
            Ok(live) => live.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Err(_) => return,
        };
        // A run's lease that expired is put back (the run is still going:
        // counting it is the point); a session place that expired is not
        // (another open may have taken it, and putting it back would hold
        // the caller over its cap for the session's life).
        for put_back in [true, false] {
            let group: Vec<&(String, Held)> = held
                .iter()
                .filter(|(_, h)| matches!(h, Held::Run(_)) == put_back)
                .collect();
            if group.is_empty() {
                continue;
            }
            let mut call = self.renew.prepare_invoke();
            call.arg(self.lease.as_millis() as u64);
            call.arg(if put_back { "put-back" } else { "existing" });
            for (id, h) in &group {
                call.key(h.set());
                call.arg(id);
            }
            let mut conn = self.conn.clone();
            match call.invoke_async::<usize>(&mut conn).await {
                Ok(n) if n == group.len() => {}
                Ok(n) => tracing::warn!(
                    held = group.len(),
                    renewed = n,
                    put_back,
                    "leases had expired while the state store was out of reach"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "the state store did not take a lease renewal")
                }
            }
        }
    }
}

/// Renews the live leases three times per lease period, until the store is
/// dropped.
async fn renew_while_alive(store: Weak<RedisStore>) {
    let period = match store.upgrade() {
        Some(s) => s.lease / 3,
        None => return,
    };
    loop {
        tokio::time::sleep(period).await;
        let Some(s) = store.upgrade() else { return };
        s.renew().await;
    }
}
