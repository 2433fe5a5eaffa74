//! The registry's caps and the per-owner replacement rule, without a
//! provider: a session here is an entry around a sandbox that does nothing.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Semaphore;

use super::*;
use crate::job::{Ended, Job, Output};
use crate::outcome::RunFailure;
use crate::providers::{Evidence, ProviderSession, SessionOffer};
use crate::quota::{QuotaSettings, Quotas};
use crate::tier::Tier;

struct Idle;

impl ProviderSession for Idle {
    fn run(&self, _job: Job) -> BoxFuture<'_, Result<Output, RunFailure>> {
        Box::pin(std::future::ready(Err(RunFailure::MayHaveRun(
            "idle".into(),
        ))))
    }
    fn ended(&self) -> Option<Ended> {
        None
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

fn registry(max: u32, per_caller: u32, per_owner: u32) -> Arc<Registry> {
    Registry::new(SessionSettings {
        max_sessions: max,
        max_per_caller: per_caller,
        max_per_owner: per_owner,
        ..SessionSettings::default()
    })
}

/// Opens a session in `r` for `caller` and `owner`, as the pipeline does.
async fn open(r: &Arc<Registry>, caller: &str, owner: Option<&str>) -> Result<Arc<Entry>, Full> {
    let reservation = r.reserve(caller, owner)?;
    let id = new_id().expect("random");
    let quotas = Quotas::new(QuotaSettings::default());
    let holds = Holds {
        daemon_slot: Arc::new(Semaphore::new(1))
            .try_acquire_owned()
            .expect("slot"),
        caller_slot: quotas.admit(caller, None, 0).await.expect("caller slot"),
        fleet_place: None,
        owner_place: None,
    };
    let entry = Entry::new(
        Opened {
            fingerprint: fingerprint(&id),
            caller: caller.into(),
            owner: owner.map(str::to_string),
            evidence: Evidence {
                sandbox: "test".into(),
                tier: Tier::Process,
                environment: String::new(),
                software_identity: String::new(),
                policy: String::new(),
            },
            floor: None,
            rule: None,
            offer: SessionOffer::default(),
            lifetime: Duration::from_secs(60),
            expires_unix_ms: 0,
            idle_timeout: Duration::ZERO,
            holder: None,
        },
        Box::new(Idle),
        holds,
        r.tick(),
    );
    r.commit(reservation, entry.clone());
    Ok(entry)
}

#[tokio::test]
async fn the_daemon_cap_counts_opens_under_way() {
    let r = registry(2, 0, 0);
    let _a = open(&r, "a", None).await.expect("first");
    let held = r.reserve("b", None).expect("second place");
    assert_eq!(r.reserve("c", None).err(), Some(Full::Daemon(2)));
    drop(held);
    assert!(
        open(&r, "c", None).await.is_ok(),
        "a dropped reservation gives its place back"
    );
}

#[tokio::test]
async fn the_caller_cap_is_per_caller_and_ended_sessions_do_not_count() {
    let r = registry(8, 2, 0);
    let a1 = open(&r, "a", None).await.expect("1");
    let _a2 = open(&r, "a", None).await.expect("2");
    assert_eq!(open(&r, "a", None).await.err(), Some(Full::Caller(2)));
    assert!(open(&r, "b", None).await.is_ok());
    a1.mark_ended(SessionEnd::Closed, "");
    assert!(open(&r, "a", None).await.is_ok());
}

#[tokio::test]
async fn at_the_owner_cap_the_least_recently_used_idle_session_is_replaced() {
    let r = registry(8, 0, 2);
    let first = open(&r, "app", Some("user1")).await.expect("1");
    let second = open(&r, "app", Some("user1")).await.expect("2");
    // The first was used since: the second is now the least recent.
    first.touch(r.tick());
    let third = open(&r, "app", Some("user1")).await.expect("replaces one");
    assert_eq!(second.ended().map(|e| e.reason), Some(SessionEnd::Replaced));
    assert!(first.ended().is_none());
    assert!(third.ended().is_none());
    // Another owner, and the same owner name for another caller, are apart.
    assert!(open(&r, "app", Some("user2")).await.is_ok());
    assert!(open(&r, "other", Some("user1")).await.is_ok());
    assert!(first.ended().is_none());
}

#[tokio::test]
async fn a_session_with_a_call_in_progress_is_never_replaced() {
    let r = registry(8, 0, 1);
    let busy = open(&r, "app", Some("u")).await.expect("1");
    let turn = busy.try_turn().expect("a call holds the turn");
    assert_eq!(open(&r, "app", Some("u")).await.err(), Some(Full::Owner(1)));
    assert!(busy.ended().is_none());
    drop(turn);
    assert!(open(&r, "app", Some("u")).await.is_ok());
    assert_eq!(busy.ended().map(|e| e.reason), Some(SessionEnd::Replaced));
}

#[tokio::test]
async fn lookups_hash_the_id_and_belong_to_the_caller() {
    let r = registry(4, 0, 0);
    let reservation = r.reserve("a", None).expect("place");
    drop(reservation);
    let id = new_id().expect("random");
    assert_eq!(id.len(), 32);
    assert_ne!(new_id().expect("random"), id);
    assert_eq!(fingerprint("abc").len(), 64);
    let e = open(&r, "a", None).await.expect("open");
    assert!(r.get("not an id", "a").is_none());
    // Only the fingerprint is kept: the registry finds a session by it,
    // and another caller's lookup of a real ID finds nothing.
    assert!(r.all().iter().any(|x| x.fingerprint == e.fingerprint));
    assert!(!valid_owner(""));
    assert!(!valid_owner(&"a".repeat(65)));
    assert!(!valid_owner("a b"));
    assert!(valid_owner(&"0f".repeat(32)));
}

#[tokio::test]
async fn one_call_waits_for_the_turn_and_a_second_is_refused() {
    let r = registry(4, 0, 0);
    let e = open(&r, "a", None).await.expect("open");
    let running = e.try_turn().expect("free");
    let waiter = {
        let e = e.clone();
        tokio::spawn(async move { e.wait_turn().await.is_some() })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        e.wait_turn().await.is_none(),
        "a second waiter is refused at once"
    );
    drop(running);
    assert!(
        waiter.await.expect("joined"),
        "the first waiter gets the turn"
    );
}

#[tokio::test]
async fn the_reaper_ends_expired_and_idle_sessions_and_drops_old_tombstones() {
    let r = registry(4, 0, 0);
    let metrics = Arc::new(crate::metrics::Metrics::new().expect("metrics"));
    let e = open(&r, "a", None).await.expect("open");
    metrics.sessions_open.inc();
    reaper::sweep(&r, &metrics, std::time::Instant::now());
    assert!(e.ended().is_none(), "neither expired nor idle");
    reaper::sweep(&r, &metrics, e.expires_at);
    assert_eq!(e.ended().map(|x| x.reason), Some(SessionEnd::Expired));
    // The close runs once the turn is free; then what it held is back.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(metrics.sessions_open.get(), 0);
    assert!(r.get("x", "a").is_none());
    assert_eq!(r.all().len(), 1, "kept as a tombstone for its close");
    reaper::sweep(
        &r,
        &metrics,
        std::time::Instant::now() + reaper::TOMBSTONE_TTL,
    );
    assert!(r.all().is_empty());
}

#[test]
fn a_closed_registry_reserves_nothing_and_counts_the_opens_under_way() {
    let r = registry(4, 0, 0);
    let under_way = r.reserve("c", None).expect("a place");
    assert_eq!(r.opening(), 1);
    assert!(!r.is_closed());
    r.close();
    assert!(r.is_closed());
    assert_eq!(r.reserve("c", None).err(), Some(Full::Stopping));
    assert_eq!(r.reserve("d", Some("o")).err(), Some(Full::Stopping));
    // The open that was under way still finishes; shutdown waits for it.
    assert_eq!(r.opening(), 1);
    drop(under_way);
    assert_eq!(r.opening(), 0);
}
