//! Which connections a listener holds, and which it lets go first.
//!
//! A connection is *untrusted* until it carries a request whose caller
//! authenticated (any request to the API in open mode; never on the metrics
//! listener). Untrusted connections are what an attacker without a token can
//! make, so they are the ones sacrificed: when a new connection would pass
//! the total cap or its peer's cap, the oldest untrusted connection (of that
//! peer, for the peer cap) is closed to make room. Only when every
//! connection that could make room is trusted is the new one refused. Each
//! connection's own deadlines (its first request, its idle time) are kept
//! here too, so one place says when a connection ends.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A connection must begin its first request this long after it is
/// accepted: the TLS handshake and protocol detection come within it.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection with no request in flight is closed after this long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How many connections a listener holds, in all and per peer address,
/// and how long one may go without a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub total: usize,
    pub per_peer: usize,
    /// From accept to the start of the first request (TLS handshake and
    /// protocol detection included).
    pub first_request: Duration,
    /// With no request in flight.
    pub idle: Duration,
}

impl ConnectionLimits {
    /// `total` and `per_peer` with the listener's standard deadlines.
    pub const fn new(total: usize, per_peer: usize) -> ConnectionLimits {
        ConnectionLimits {
            total,
            per_peer,
            first_request: FIRST_REQUEST_TIMEOUT,
            idle: IDLE_TIMEOUT,
        }
    }
}

#[derive(Default)]
struct Inner {
    next: u64,
    open: HashMap<u64, Arc<Connection>>,
    per_peer: HashMap<IpAddr, usize>,
    /// Untrusted connections, oldest first, in all and per peer.
    untrusted: BTreeMap<u64, IpAddr>,
    untrusted_of: HashMap<IpAddr, BTreeSet<u64>>,
}

impl Inner {
    fn remove(&mut self, id: u64) -> Option<Arc<Connection>> {
        let conn = self.open.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&conn.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&conn.peer);
            }
        }
        self.forget_untrusted(id, conn.peer);
        Some(conn)
    }

    fn forget_untrusted(&mut self, id: u64, peer: IpAddr) {
        self.untrusted.remove(&id);
        if let Some(set) = self.untrusted_of.get_mut(&peer) {
            set.remove(&id);
            if set.is_empty() {
                self.untrusted_of.remove(&peer);
            }
        }
    }

    /// Closes the connection `id` to make room.
    fn evict(&mut self, id: u64) {
        if let Some(conn) = self.remove(id) {
            conn.end(true);
        }
    }
}

/// The connections one listener holds.
pub struct Table {
    limits: ConnectionLimits,
    inner: Arc<Mutex<Inner>>,
}

impl Table {
    pub fn new(limits: ConnectionLimits) -> Table {
        Table {
            limits,
            inner: Arc::new(Mutex::new(Inner::default())),
        }
    }

    /// Makes room for a connection from `peer` and registers it, or refuses
    /// it when only trusted connections could make room.
    pub fn admit(&self, peer: IpAddr) -> Option<Arc<Connection>> {
        let mut t = self.inner.lock().ok()?;
        if t.per_peer.get(&peer).copied().unwrap_or(0) >= self.limits.per_peer {
            let oldest = t.untrusted_of.get(&peer).and_then(|s| s.first().copied())?;
            t.evict(oldest);
        }
        if t.open.len() >= self.limits.total {
            let oldest = t.untrusted.first_key_value().map(|(id, _)| *id)?;
            t.evict(oldest);
        }
        let id = t.next;
        t.next += 1;
        let conn = Arc::new(Connection {
            id,
            peer,
            opened: Instant::now(),
            trusted: AtomicBool::new(false),
            began: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            last_active: Mutex::new(Instant::now()),
            ending: Notify::new(),
            evicted: AtomicBool::new(false),
            first_request: self.limits.first_request,
            idle: self.limits.idle,
            table: Arc::downgrade(&self.inner),
        });
        t.open.insert(id, conn.clone());
        *t.per_peer.entry(peer).or_insert(0) += 1;
        t.untrusted.insert(id, peer);
        t.untrusted_of.entry(peer).or_default().insert(id);
        Some(conn)
    }

    /// Connections held now.
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |t| t.open.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One accepted connection, as its task and its requests see it.
pub struct Connection {
    id: u64,
    peer: IpAddr,
    opened: Instant,
    trusted: AtomicBool,
    began: AtomicBool,
    in_flight: AtomicUsize,
    last_active: Mutex<Instant>,
    ending: Notify,
    evicted: AtomicBool,
    first_request: Duration,
    idle: Duration,
    table: Weak<Mutex<Inner>>,
}

/// A request in flight on a connection; done when dropped.
pub struct Busy(Arc<Connection>);

impl Drop for Busy {
    fn drop(&mut self) {
        if let Ok(mut t) = self.0.last_active.lock() {
            *t = Instant::now();
        }
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Connection {
    /// The connection carried a request whose caller authenticated: it is
    /// no longer among the first to be closed to make room.
    pub fn trust(&self) {
        if self.trusted.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(table) = self.table.upgrade()
            && let Ok(mut t) = table.lock()
        {
            t.forget_untrusted(self.id, self.peer);
        }
    }

    pub fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Acquire)
    }

    pub(super) fn begin_request(self: &Arc<Self>) -> Busy {
        self.began.store(true, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    fn end(&self, evicted: bool) {
        if evicted {
            self.evicted.store(true, Ordering::Release);
        }
        self.ending.notify_one();
    }

    /// Resolves when the connection must end: it was closed to make room,
    /// it did not begin a request in time, or it has had no request in
    /// flight for its idle time.
    pub(super) async fn ended(&self) {
        loop {
            let now = Instant::now();
            let until = if !self.began.load(Ordering::Acquire) {
                self.opened + self.first_request
            } else if self.in_flight.load(Ordering::Acquire) == 0 {
                self.last_active.lock().map_or(now, |t| *t) + self.idle
            } else {
                now + self.idle
            };
            if until <= now {
                return;
            }
            tokio::select! {
                () = self.ending.notified() => return,
                () = tokio::time::sleep_until(until.into()) => {}
            }
            if self.evicted.load(Ordering::Acquire) {
                return;
            }
        }
    }

    /// Removes the connection from its table (its task is ending).
    pub(super) fn close(&self) {
        if let Some(table) = self.table.upgrade()
            && let Ok(mut t) = table.lock()
        {
            t.remove(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn the_oldest_untrusted_connection_makes_room() {
        let t = Table::new(ConnectionLimits::new(3, 2));
        let a1 = t.admit(ip(1)).expect("a1");
        let a2 = t.admit(ip(1)).expect("a2");
        // The peer is at its cap: its oldest untrusted goes.
        let a3 = t.admit(ip(1)).expect("a3");
        assert!(a1.evicted.load(Ordering::Acquire));
        assert_eq!(t.len(), 2);
        // A trusted connection is never the one to go.
        a2.trust();
        let a4 = t.admit(ip(1)).expect("a4");
        assert!(a3.evicted.load(Ordering::Acquire));
        assert!(!a2.evicted.load(Ordering::Acquire));
        a4.trust();
        assert!(
            t.admit(ip(1)).is_none(),
            "only trusted ones could make room"
        );
        // The total cap: another peer's connection takes the last place...
        let b1 = t.admit(ip(2)).expect("b1");
        // ...and the next one from a third peer evicts it, the oldest
        // untrusted one anywhere.
        let _c1 = t.admit(ip(3)).expect("c1");
        assert!(b1.evicted.load(Ordering::Acquire));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn closing_frees_the_place() {
        let t = Table::new(ConnectionLimits::new(1, 1));
        let a = t.admit(ip(1)).expect("a");
        a.trust();
        assert!(t.admit(ip(2)).is_none());
        a.close();
        assert!(t.admit(ip(2)).is_some());
    }

    fn quick() -> Table {
        Table::new(ConnectionLimits {
            total: 8,
            per_peer: 8,
            first_request: Duration::from_millis(100),
            idle: Duration::from_millis(200),
        })
    }

    #[tokio::test]
    async fn a_connection_without_a_first_request_ends_at_its_deadline() {
        let c = quick().admit(ip(1)).expect("admitted");
        let t = Instant::now();
        c.ended().await;
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(100) && waited < Duration::from_millis(500),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn an_idle_connection_ends_and_a_busy_one_does_not() {
        let table = quick();
        let c = table.admit(ip(1)).expect("admitted");
        let busy = c.begin_request();
        // A request in flight keeps it open past the idle time...
        let ended = tokio::time::timeout(Duration::from_millis(400), c.ended()).await;
        assert!(ended.is_err(), "a busy connection ended");
        // ...and the idle time counts from when the last one finished.
        drop(busy);
        let t = Instant::now();
        c.ended().await;
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(180) && waited < Duration::from_millis(600),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn an_evicted_connection_ends_at_once() {
        let table = Table::new(ConnectionLimits::new(1, 1));
        let first = table.admit(ip(1)).expect("first");
        let _second = table.admit(ip(2)).expect("second");
        tokio::time::timeout(Duration::from_millis(100), first.ended())
            .await
            .expect("ended at once");
    }
}
