//! Which connections a listener holds, and which it lets go first.
//!
//! A connection is *untrusted* until it carries a request whose caller
//! authenticated (any request to the API in open mode; never on the metrics
//! listener). Untrusted connections are what an attacker without a token can
//! make, so they are the ones sacrificed: when a new connection would pass
//! its peer's cap, that peer's oldest untrusted connection is closed to make
//! room; when it would pass the total cap, the oldest untrusted connection
//! of the network (an IPv4 /24, an IPv6 /64) holding the most untrusted
//! connections is. Only when every connection that could make room is
//! trusted is the new one refused.
//!
//! Why the peer with the most, and not simply the oldest anywhere: an
//! attacker that reopens every connection it loses makes the newest
//! connection anywhere the next-but-N to go, so a caller's fresh connection
//! lived only as long as it took the flood to open N more (tens of
//! milliseconds), too short for a TLS handshake or a slow network. Charged
//! to the network that holds the most, a flood churns its own connections
//! and a caller's fresh connection from another network is not the one
//! taken. Networks rather than addresses: one address each is cheap for a
//! flood (an IPv6 /64 is one host's, and a flood spread over as many
//! addresses as the cap tied with the caller's and took it again). A flood
//! from the caller's own network still competes with it: an address is
//! all the listener knows before a request.
//!
//! Each connection's own deadlines (its first request, its idle time, a
//! request's headers, an answer its peer will not take) are kept here too,
//! so one place says when a connection ends.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A connection must begin its first request this long after it is
/// accepted: the TLS handshake and protocol detection come within it.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection with no request in flight is closed after this long.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// An HTTP/1 request's headers must be complete this long after its first
/// byte arrived. Counted from that byte, not from the end of the previous
/// answer, so a kept-alive connection may wait for its next request as long
/// as `IDLE_TIMEOUT` allows.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// An answer whose peer takes none of it for this long ends its connection:
/// a peer that stops reading (or opens no HTTP/2 flow-control window) would
/// otherwise hold the answer's memory for as long as it liked.
pub const ANSWER_STALL_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// From the first byte of an HTTP/1 request to its complete headers.
    pub header: Duration,
    /// How long an answer may wait for its peer to take its next piece.
    pub answer_stall: Duration,
}

impl ConnectionLimits {
    /// `total` and `per_peer` with the listener's standard deadlines.
    pub const fn new(total: usize, per_peer: usize) -> ConnectionLimits {
        ConnectionLimits {
            total,
            per_peer,
            first_request: FIRST_REQUEST_TIMEOUT,
            idle: IDLE_TIMEOUT,
            header: HEADER_READ_TIMEOUT,
            answer_stall: ANSWER_STALL_TIMEOUT,
        }
    }
}

#[derive(Default)]
struct Inner {
    next: u64,
    open: HashMap<u64, Arc<Connection>>,
    per_peer: HashMap<IpAddr, usize>,
    /// Untrusted connections, oldest first, per peer address.
    untrusted_of: HashMap<IpAddr, BTreeSet<u64>>,
    /// Untrusted connections, oldest first, per network (`network_of`).
    untrusted_in: HashMap<IpAddr, BTreeSet<u64>>,
    /// Every network holding untrusted connections, ordered so the last is
    /// the one that pays at the total cap: the most untrusted connections,
    /// then (for equal counts) the oldest one among them.
    load: BTreeSet<Load>,
    /// Bytes of answers each caller has not yet taken, over all its
    /// connections (`delivery`).
    unread: HashMap<Arc<str>, usize>,
}

/// A network's place in `Inner::load`: its untrusted count, then its oldest
/// untrusted connection reversed, so that among equal counts the network
/// with the older connection sorts last.
type Load = (usize, std::cmp::Reverse<u64>, IpAddr);

fn load_of(net: IpAddr, set: &BTreeSet<u64>) -> Option<Load> {
    let oldest = *set.first()?;
    Some((set.len(), std::cmp::Reverse(oldest), net))
}

/// The network an address is charged to at the total cap: its IPv4 /24
/// (an IPv4-mapped IPv6 address counts as IPv4), or its IPv6 /64.
fn network_of(ip: IpAddr) -> IpAddr {
    let v4 = match ip {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    };
    match (v4, ip) {
        (Some(v4), _) => IpAddr::V4(std::net::Ipv4Addr::from(u32::from(v4) & 0xffff_ff00)),
        (None, IpAddr::V6(v6)) => IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(v6) & !((1u128 << 64) - 1),
        )),
        (None, IpAddr::V4(_)) => ip,
    }
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

    fn add_untrusted(&mut self, id: u64, peer: IpAddr) {
        self.untrusted_of.entry(peer).or_default().insert(id);
        let net = network_of(peer);
        let set = self.untrusted_in.entry(net).or_default();
        if let Some(old) = load_of(net, set) {
            self.load.remove(&old);
        }
        set.insert(id);
        if let Some(new) = load_of(net, set) {
            self.load.insert(new);
        }
    }

    fn forget_untrusted(&mut self, id: u64, peer: IpAddr) {
        let Some(set) = self.untrusted_of.get_mut(&peer) else {
            return;
        };
        if !set.remove(&id) {
            return;
        }
        if set.is_empty() {
            self.untrusted_of.remove(&peer);
        }
        let net = network_of(peer);
        let Some(set) = self.untrusted_in.get_mut(&net) else {
            return;
        };
        if let Some(old) = load_of(net, set) {
            self.load.remove(&old);
        }
        set.remove(&id);
        match load_of(net, set) {
            Some(new) => {
                self.load.insert(new);
            }
            None => {
                self.untrusted_in.remove(&net);
            }
        }
    }

    /// The untrusted connection to close at the total cap: the oldest of
    /// the network holding the most.
    fn total_cap_victim(&self) -> Option<u64> {
        self.load
            .last()
            .map(|&(_, std::cmp::Reverse(oldest), _)| oldest)
    }

    /// Closes the connection `id` to make room.
    fn evict(&mut self, id: u64) {
        if let Some(conn) = self.remove(id) {
            conn.close_now();
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
            let victim = t.total_cap_victim()?;
            t.evict(victim);
        }
        let id = t.next;
        t.next += 1;
        let now = Instant::now();
        let conn = Arc::new(Connection {
            id,
            peer,
            opened: now,
            trusted: AtomicBool::new(false),
            caller: OnceLock::new(),
            began: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            last_active: Mutex::new(now),
            head_since: Mutex::new(None),
            stalls: Mutex::new(HashMap::new()),
            next_answer: AtomicU64::new(0),
            ending: Notify::new(),
            closing: AtomicBool::new(false),
            limits: self.limits,
            table: Arc::downgrade(&self.inner),
        });
        t.open.insert(id, conn.clone());
        *t.per_peer.entry(peer).or_insert(0) += 1;
        t.add_untrusted(id, peer);
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
    /// Who authenticated on it: their unread answers are counted together.
    caller: OnceLock<Arc<str>>,
    began: AtomicBool,
    in_flight: AtomicUsize,
    last_active: Mutex<Instant>,
    /// When the first byte of an HTTP/1 request head arrived, while no
    /// request was in flight; cleared when the head is complete.
    head_since: Mutex<Option<Instant>>,
    /// Answers waiting for the peer to take their next piece, by answer,
    /// since when.
    stalls: Mutex<HashMap<u64, Instant>>,
    next_answer: AtomicU64,
    /// Wakes `ended` to look at the deadlines again.
    ending: Notify,
    /// Set when the connection must close at once (it was closed to make
    /// room).
    closing: AtomicBool,
    limits: ConnectionLimits,
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
        // The idle deadline starts now.
        self.0.ending.notify_one();
    }
}

impl Connection {
    /// The connection carried a request whose caller (`caller`, the ID
    /// their answers are counted under) authenticated: it is no longer
    /// among the first to be closed to make room.
    pub fn trust(&self, caller: &str) {
        let _ = self.caller.set(Arc::from(caller));
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

    /// Bytes of answers the caller who authenticated on this connection
    /// has not taken yet, on all their connections to this listener.
    pub fn unread_answers(&self) -> usize {
        let (Some(caller), Some(table)) = (self.caller.get(), self.table.upgrade()) else {
            return 0;
        };
        table
            .lock()
            .map_or(0, |t| t.unread.get(caller).copied().unwrap_or(0))
    }

    pub(super) fn begin_request(self: &Arc<Self>) -> Busy {
        self.began.store(true, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if let Ok(mut h) = self.head_since.lock() {
            *h = None;
        }
        Busy(self.clone())
    }

    /// Bytes arrived on an HTTP/1 connection. With no request in flight
    /// they begin the next request's head, whose deadline starts now.
    pub(super) fn head_bytes_arrived(&self) {
        if self.in_flight.load(Ordering::Acquire) != 0 {
            return;
        }
        let Ok(mut h) = self.head_since.lock() else {
            return;
        };
        if h.is_none() {
            *h = Some(Instant::now());
            drop(h);
            self.ending.notify_one();
        }
    }

    /// A new answer on this connection, for `delivery` to report on.
    pub(super) fn next_answer_id(&self) -> u64 {
        self.next_answer.fetch_add(1, Ordering::Relaxed)
    }

    /// The answer `answer` is waiting for the peer to take a piece
    /// (`Some(since)`), or not (`None`).
    pub(super) fn answer_waits(&self, answer: u64, since: Option<Instant>) {
        let Ok(mut stalls) = self.stalls.lock() else {
            return;
        };
        let was_first = stalls.is_empty();
        match since {
            Some(t) => {
                stalls.insert(answer, t);
            }
            None => {
                stalls.remove(&answer);
            }
        }
        drop(stalls);
        if was_first && since.is_some() {
            self.ending.notify_one();
        }
    }

    /// Counts `add` more and `sub` fewer bytes of unread answers for the
    /// caller who authenticated here (the API refuses new work from a
    /// caller past its budget: `unread_answers`).
    pub(super) fn unread_changed(&self, add: usize, sub: usize) {
        let (Some(caller), Some(table)) = (self.caller.get(), self.table.upgrade()) else {
            return;
        };
        let Ok(mut t) = table.lock() else {
            return;
        };
        let n = t.unread.entry(caller.clone()).or_insert(0);
        *n = (*n + add).saturating_sub(sub);
        if *n == 0 {
            t.unread.remove(caller);
        }
    }

    fn close_now(&self) {
        self.closing.store(true, Ordering::Release);
        self.ending.notify_one();
    }

    /// The earliest deadline the connection is under now.
    fn deadline(&self, now: Instant) -> Instant {
        let l = &self.limits;
        let mut until = if !self.began.load(Ordering::Acquire) {
            self.opened + l.first_request
        } else if self.in_flight.load(Ordering::Acquire) == 0 {
            self.last_active.lock().map_or(now, |t| *t) + l.idle
        } else {
            now + l.idle
        };
        if let Ok(h) = self.head_since.lock()
            && let Some(t) = *h
        {
            until = until.min(t + l.header);
        }
        if let Ok(stalls) = self.stalls.lock()
            && let Some(t) = stalls.values().min()
        {
            until = until.min(*t + l.answer_stall);
        }
        until
    }

    /// Resolves when the connection must end: it was closed to make room,
    /// it did not begin a request in time,
    /// a request's headers did not arrive in time, an answer's peer took
    /// nothing of it for too long, or it has had no request in flight for
    /// its idle time.
    pub(super) async fn ended(&self) {
        loop {
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            let until = self.deadline(now);
            if until <= now {
                return;
            }
            // A wake-up only means "look again": a deadline may have moved.
            tokio::select! {
                () = self.ending.notified() => {}
                () = tokio::time::sleep_until(until.into()) => {}
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

    /// An address in a network of its own (`network_of`).
    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, n, 1])
    }

    #[test]
    fn the_oldest_untrusted_connection_makes_room() {
        let t = Table::new(ConnectionLimits::new(3, 2));
        let a1 = t.admit(ip(1)).expect("a1");
        let a2 = t.admit(ip(1)).expect("a2");
        // The peer is at its cap: its oldest untrusted goes.
        let a3 = t.admit(ip(1)).expect("a3");
        assert!(a1.closing.load(Ordering::Acquire));
        assert_eq!(t.len(), 2);
        // A trusted connection is never the one to go.
        a2.trust("a");
        let a4 = t.admit(ip(1)).expect("a4");
        assert!(a3.closing.load(Ordering::Acquire));
        assert!(!a2.closing.load(Ordering::Acquire));
        a4.trust("a");
        assert!(
            t.admit(ip(1)).is_none(),
            "only trusted ones could make room"
        );
        // The total cap: another peer's connection takes the last place...
        let b1 = t.admit(ip(2)).expect("b1");
        // ...and the next one from a third peer evicts it, the oldest
        // untrusted one anywhere.
        let _c1 = t.admit(ip(3)).expect("c1");
        assert!(b1.closing.load(Ordering::Acquire));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn closing_frees_the_place() {
        let t = Table::new(ConnectionLimits::new(1, 1));
        let a = t.admit(ip(1)).expect("a");
        a.trust("a");
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
            header: Duration::from_millis(150),
            answer_stall: Duration::from_millis(150),
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

    /// A flood from one address that reopens what it loses churns its own
    /// connections at the total cap: a caller's fresh connection from
    /// another address is not taken, however many arrive after it. (Closing
    /// the oldest connection anywhere took it after three.)
    #[test]
    fn at_the_total_cap_the_peer_holding_the_most_pays() {
        let t = Table::new(ConnectionLimits::new(4, 4));
        let flood: Vec<_> = (0..3).map(|_| t.admit(ip(9)).expect("flood")).collect();
        let caller = t.admit(ip(1)).expect("caller");
        for _ in 0..50 {
            let _ = t.admit(ip(9)).expect("the flood makes its own room");
        }
        assert!(
            !caller.closing.load(Ordering::Acquire),
            "the caller's connection was taken"
        );
        assert!(flood.iter().all(|c| c.closing.load(Ordering::Acquire)));
        assert_eq!(t.len(), 4);
    }

    /// Spread one a peer, the flood ties with the caller's address, and the
    /// oldest untrusted connection among the tied peers goes.
    #[test]
    fn among_equal_peers_the_oldest_goes() {
        let t = Table::new(ConnectionLimits::new(3, 3));
        let a = t.admit(ip(1)).expect("a");
        let b = t.admit(ip(2)).expect("b");
        let c = t.admit(ip(3)).expect("c");
        let _d = t.admit(ip(4)).expect("d");
        assert!(a.closing.load(Ordering::Acquire));
        assert!(!b.closing.load(Ordering::Acquire) && !c.closing.load(Ordering::Acquire));
        // Still one each when it arrives: the oldest, b, goes...
        let _e = t.admit(ip(4)).expect("e");
        assert!(b.closing.load(Ordering::Acquire));
        // ...but now ip 4 holds two, and pays before c does.
        let _f = t.admit(ip(5)).expect("f");
        assert!(!c.closing.load(Ordering::Acquire), "ip 4 holds the most");
    }

    /// A kept-alive connection waits for its next request as long as its
    /// idle time, not its header deadline; once bytes of a request head
    /// arrive, the header deadline runs from them.
    #[tokio::test]
    async fn the_header_deadline_runs_from_the_first_byte_of_a_head() {
        let table = Table::new(ConnectionLimits {
            idle: Duration::from_secs(5),
            ..quick().limits
        });
        let c = table.admit(ip(1)).expect("admitted");
        drop(c.begin_request());
        let quiet = tokio::time::timeout(Duration::from_millis(400), c.ended()).await;
        assert!(
            quiet.is_err(),
            "an idle kept-alive connection ended at the header deadline"
        );
        c.head_bytes_arrived();
        let t = Instant::now();
        c.ended().await;
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(140) && waited < Duration::from_millis(600),
            "{waited:?}"
        );
        // A complete head (the request began) clears it.
        let c = table.admit(ip(1)).expect("admitted");
        c.head_bytes_arrived();
        let busy = c.begin_request();
        let held = tokio::time::timeout(Duration::from_millis(300), c.ended()).await;
        assert!(
            held.is_err(),
            "a request in flight ended at the header deadline"
        );
        drop(busy);
    }

    /// An answer its peer takes nothing of ends the connection, request in
    /// flight or not; one that is taken in time does not.
    #[tokio::test]
    async fn an_answer_left_unread_ends_its_connection() {
        let table = quick();
        let c = table.admit(ip(1)).expect("admitted");
        let _busy = c.begin_request();
        let answer = c.next_answer_id();
        c.answer_waits(answer, Some(Instant::now()));
        let t = Instant::now();
        c.ended().await;
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(140) && waited < Duration::from_millis(400),
            "{waited:?}"
        );
        let c = table.admit(ip(1)).expect("admitted");
        let _busy = c.begin_request();
        c.answer_waits(answer, Some(Instant::now()));
        c.answer_waits(answer, None);
        let held = tokio::time::timeout(Duration::from_millis(300), c.ended()).await;
        assert!(held.is_err(), "a taken answer ended its connection");
    }

    #[test]
    fn unread_answers_are_counted_per_caller_across_connections() {
        let t = Table::new(ConnectionLimits::new(8, 8));
        let a1 = t.admit(ip(1)).expect("a1");
        let a2 = t.admit(ip(2)).expect("a2");
        let b = t.admit(ip(1)).expect("b");
        a1.trust("alice");
        a2.trust("alice");
        b.trust("bob");
        a1.unread_changed(100, 0);
        a2.unread_changed(50, 0);
        b.unread_changed(7, 0);
        assert_eq!(a1.unread_answers(), 150);
        assert_eq!(b.unread_answers(), 7);
        a1.unread_changed(0, 100);
        assert_eq!(a2.unread_answers(), 50);
        // An unauthenticated connection's answers count for nobody.
        let anon = t.admit(ip(3)).expect("anon");
        anon.unread_changed(1_000, 0);
        assert_eq!(anon.unread_answers(), 0);
    }

    /// A flood with one address per connection ties with the caller's
    /// address; charged by network, it is one network holding the most.
    #[test]
    fn a_flood_spread_over_addresses_pays_as_one_network() {
        let t = Table::new(ConnectionLimits::new(8, 8));
        let caller = t.admit(IpAddr::from([127, 0, 0, 1])).expect("caller");
        for i in 0..200u8 {
            let _ = t
                .admit(IpAddr::from([10, 9, 9, i]))
                .expect("the flood makes its own room");
        }
        assert!(
            !caller.closing.load(Ordering::Acquire),
            "the caller's connection was taken"
        );
    }

    #[test]
    fn networks_are_ipv4_slash_24_and_ipv6_slash_64() {
        let n = |s: &str| network_of(s.parse().expect("address"));
        assert_eq!(n("192.0.2.77"), n("192.0.2.1"));
        assert_ne!(n("192.0.2.77"), n("192.0.3.77"));
        assert_eq!(n("::ffff:192.0.2.9"), n("192.0.2.200"));
        assert_eq!(n("2001:db8:1:2:aaaa::1"), n("2001:db8:1:2::ffff"));
        assert_ne!(n("2001:db8:1:2::1"), n("2001:db8:1:3::1"));
    }
}
