//! Who holds the admin server's connections and event streams, per client, and whose gives way
//! when they run out.
//!
//! A limit that refuses the newcomer lets whoever got there first keep everything: a client that
//! opens 600 connections and sends nothing on them held all 512 connections, and the kubelet's
//! probes were refused (reset) 28 times in 30. So a full table does not refuse; it makes room:
//!
//! - **per client**: a client at its own limit gets its new slot by giving up its own oldest
//!   one that may go (an idle connection; any stream);
//! - **in all**: at the server's limit, the slot that goes is the oldest one that may go of the
//!   client holding the most, provided that client holds at least two more than the newcomer;
//!   else the newcomer's own oldest that may go, when its client holds as many as any; else the
//!   newcomer is refused. A client with few slots (the kubelet: one connection per
//!   probe) is never the one to give way to a client with many, whatever the order they came in.
//!
//! A connection may go while it waits for a request (its first, or the next on a kept-alive
//! connection); one that is being answered is not cut. A probe is answered as soon as its head is
//! read, so it is never waiting long; what a client holds idle is what it loses first.
//!
//! **A client is its address**: an IPv4 address, or an IPv6 address's /64 (one host is commonly
//! given a whole /64, so that one host cannot pose as billions of clients). Whatever shares an
//! address is one client: in a pod, the kubelet's probes come from the node's address, which
//! every `hostNetwork` pod of the node shares; `kubectl port-forward` delivers every forwarded
//! connection from 127.0.0.1 inside the pod, so all port-forwarding users are one client; so are
//! the users of a VPN or a NAT that reach the admin address from one address. Between them, the
//! newest wins and the oldest idle gives way: a probe from an address that also holds hundreds of
//! idle connections evicts one and is answered, unless that address opens more connections than
//! the limit in the moment between the probe's connection and its request.
//!
//! The choice is pure ([`choose`]); [`Slots`] holds the table under a lock taken for a lookup.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// A client as the limits count it: see the module's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Client(IpAddr);

impl Client {
    /// The client a connection from `address` belongs to.
    pub fn of(address: IpAddr) -> Client {
        match address {
            IpAddr::V4(v4) => Client(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Client(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    Client(IpAddr::V6(Ipv6Addr::from(prefix)))
                }
            },
        }
    }
}

impl Default for Client {
    /// Requests that came on no connection (the router called directly, in tests).
    fn default() -> Client {
        Client(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
    }
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
            v4 => write!(f, "{v4}"),
        }
    }
}

/// How a slot that gives way is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    Open,
    /// Finish what is being written, then close (an event stream ends with a last comment).
    Graceful,
    /// Close now: nothing is owed (an idle connection, a client that does not read).
    Abort,
}

/// One slot held: given back when dropped. Whoever holds it watches [`Slot::closing`].
#[derive(Debug)]
pub struct Slot {
    id: u64,
    table: Arc<Table>,
    holder: Arc<Holder>,
}

#[derive(Debug)]
struct Holder {
    client: Client,
    /// Requests being answered on it: a connection is idle when none is.
    busy: AtomicUsize,
    /// Whether it may give way at all while busy (an event stream may; a connection may not).
    always_evictable: bool,
    closing: watch::Sender<Closing>,
    /// Set once it was told to go: counted once.
    told: AtomicBool,
}

#[derive(Debug)]
struct Table {
    per_client: usize,
    total: usize,
    state: Mutex<State>,
    evicted: AtomicU64,
    refused: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    held: BTreeMap<u64, Arc<Holder>>,
    counts: HashMap<Client, usize>,
}

/// A table of slots, at most `per_client` per client and `total` in all. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Slots(Arc<Table>);

/// What a full table does for a newcomer ([`choose`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Admit,
    /// Admit, once this slot has been told to go.
    Evict(u64),
    Refuse,
}

/// One slot as [`choose`] sees it: its id (the older the smaller), its client, and whether it may
/// give way now.
#[derive(Debug, Clone, Copy)]
pub struct HeldSlot {
    pub id: u64,
    pub client: Client,
    pub evictable: bool,
}

/// What a newcomer of `client` gets, given what is held (oldest first) and the limits.
pub fn choose(held: &[HeldSlot], client: Client, per_client: usize, total: usize) -> Choice {
    let mut counts: HashMap<Client, usize> = HashMap::new();
    for h in held {
        *counts.entry(h.client).or_default() += 1;
    }
    let own = counts.get(&client).copied().unwrap_or(0);
    if own >= per_client {
        return held
            .iter()
            .find(|h| h.client == client && h.evictable)
            .map_or(Choice::Refuse, |h| Choice::Evict(h.id));
    }
    if held.len() < total {
        return Choice::Admit;
    }
    // The oldest evictable slot of the client holding the most (the first found wins a tie:
    // the oldest).
    let mut best: Option<(usize, u64, Client)> = None;
    for h in held.iter().filter(|h| h.evictable) {
        let count = counts.get(&h.client).copied().unwrap_or(0);
        if best.is_none_or(|(c, _, _)| count > c) {
            best = Some((count, h.id, h.client));
        }
    }
    let own_oldest = || {
        held.iter()
            .find(|h| h.client == client && h.evictable)
            .map_or(Choice::Refuse, |h| Choice::Evict(h.id))
    };
    match best {
        None => Choice::Refuse,
        Some((_, id, biggest)) if biggest == client => Choice::Evict(id),
        // The newcomer's client holds as many as any: its own oldest goes, if one may.
        Some((count, _, _)) if own >= count => own_oldest(),
        Some((count, id, _)) if count > own + 1 => Choice::Evict(id),
        _ => Choice::Refuse,
    }
}

impl Slots {
    pub fn new(per_client: usize, total: usize) -> Slots {
        Slots(Arc::new(Table {
            per_client,
            total,
            state: Mutex::new(State::default()),
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }))
    }

    /// A slot for `client`, another one told to go (`how`) if that makes room; `None` when
    /// nothing may give way. `always_evictable`: the slot may be taken from its holder even
    /// while busy (an event stream).
    pub fn take(&self, client: Client, always_evictable: bool, how: Closing) -> Option<Slot> {
        let state = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        let own = state.counts.get(&client).copied().unwrap_or(0);
        let choice = if own < self.0.per_client && state.held.len() < self.0.total {
            // Room without looking at who holds what.
            Choice::Admit
        } else {
            self.choose_in(&state, client)
        };
        self.admit(state, client, always_evictable, how, choice)
    }

    fn choose_in(&self, state: &State, client: Client) -> Choice {
        let held: Vec<HeldSlot> = state
            .held
            .iter()
            .map(|(&id, h)| HeldSlot {
                id,
                client: h.client,
                evictable: h.always_evictable || h.busy.load(Ordering::Acquire) == 0,
            })
            .collect();
        choose(&held, client, self.0.per_client, self.0.total)
    }

    fn admit(
        &self,
        mut state: std::sync::MutexGuard<'_, State>,
        client: Client,
        always_evictable: bool,
        how: Closing,
        choice: Choice,
    ) -> Option<Slot> {
        match choice {
            Choice::Refuse => {
                self.0.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Choice::Evict(id) => {
                if let Some(victim) = state.held.remove(&id) {
                    release(&mut state, victim.client);
                    if !victim.told.swap(true, Ordering::AcqRel) {
                        self.0.evicted.fetch_add(1, Ordering::Relaxed);
                    }
                    victim.closing.send_replace(how);
                }
            }
            Choice::Admit => {}
        }
        let id = state.next;
        state.next += 1;
        let holder = Arc::new(Holder {
            client,
            busy: AtomicUsize::new(0),
            always_evictable,
            closing: watch::channel(Closing::Open).0,
            told: AtomicBool::new(false),
        });
        state.held.insert(id, holder.clone());
        *state.counts.entry(client).or_default() += 1;
        Some(Slot {
            id,
            table: self.0.clone(),
            holder,
        })
    }

    /// Slots held now.
    pub fn held(&self) -> usize {
        self.0
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .held
            .len()
    }

    /// Slots told to go to make room, since the start.
    pub fn evicted(&self) -> u64 {
        self.0.evicted.load(Ordering::Relaxed)
    }

    /// Newcomers refused because nothing could give way, since the start.
    pub fn refused(&self) -> u64 {
        self.0.refused.load(Ordering::Relaxed)
    }
}

fn release(state: &mut State, client: Client) {
    if let Some(count) = state.counts.get_mut(&client) {
        *count -= 1;
        if *count == 0 {
            state.counts.remove(&client);
        }
    }
}

impl Slot {
    pub fn client(&self) -> Client {
        self.holder.client
    }

    /// Marks a request being answered until the guard is dropped: the slot may not be taken
    /// meanwhile (unless it always may).
    pub fn busy(&self) -> Busy {
        self.holder.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.holder.clone())
    }

    /// Waits until the slot is told to go; says how.
    pub async fn closing(&self) -> Closing {
        let mut watch = self.holder.closing.subscribe();
        let how = match watch.wait_for(|c| *c != Closing::Open).await {
            Ok(how) => *how,
            // The sender lives in the holder, which lives as long as `self`.
            Err(_) => Closing::Abort,
        };
        how
    }

    /// A handle that tells this slot to go, for whoever serves on it (an event stream closes
    /// its connection so).
    pub fn closer(&self) -> Closer {
        Closer(self.holder.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.table.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.held.remove(&self.id).is_some() {
            release(&mut state, self.holder.client);
        }
    }
}

/// A request being answered on a slot ([`Slot::busy`]).
#[derive(Debug)]
pub struct Busy(Arc<Holder>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Tells a slot to go ([`Slot::closer`]).
#[derive(Debug, Clone)]
pub struct Closer(Arc<Holder>);

impl Closer {
    pub fn close(&self, how: Closing) {
        self.0.closing.send_if_modified(|now| {
            // An abort overrides a graceful close, never the other way.
            if *now == Closing::Abort || *now == how {
                return false;
            }
            *now = how;
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(last: u8) -> Client {
        Client::of(IpAddr::from([10, 0, 0, last]))
    }

    fn held(slots: &[(u64, Client, bool)]) -> Vec<HeldSlot> {
        slots
            .iter()
            .map(|&(id, client, evictable)| HeldSlot {
                id,
                client,
                evictable,
            })
            .collect()
    }

    #[test]
    fn a_client_at_its_limit_gives_up_its_own_oldest_idle_slot() {
        let table = held(&[
            (1, c(1), false),
            (2, c(1), true),
            (3, c(1), true),
            (4, c(2), true),
        ]);
        assert_eq!(choose(&table, c(1), 3, 10), Choice::Evict(2));
        // Nothing of its own may go: refused, never another client's.
        let table = held(&[(1, c(1), false), (2, c(1), false), (4, c(2), true)]);
        assert_eq!(choose(&table, c(1), 2, 10), Choice::Refuse);
        assert_eq!(choose(&table, c(2), 2, 10), Choice::Admit);
    }

    #[test]
    fn a_full_table_takes_from_the_client_holding_the_most() {
        // One client holds nearly everything idle; the kubelet comes with none.
        let mut slots: Vec<(u64, Client, bool)> = (1..=9).map(|id| (id, c(1), true)).collect();
        slots.push((10, c(2), true));
        let table = held(&slots);
        assert_eq!(choose(&table, c(3), 10, 10), Choice::Evict(1));
        assert_eq!(choose(&table, c(2), 10, 10), Choice::Evict(1));
        // The big client's own newcomer: its own oldest goes, not the small client's.
        assert_eq!(choose(&table, c(1), 10, 10), Choice::Evict(1));
        // Its busy slots stay; the oldest idle one goes.
        slots[0].2 = false;
        assert_eq!(choose(&held(&slots), c(3), 10, 10), Choice::Evict(2));
    }

    #[test]
    fn a_client_is_never_evicted_for_one_that_would_then_hold_as_many() {
        let table = held(&[
            (1, c(1), true),
            (2, c(1), true),
            (3, c(2), true),
            (4, c(2), true),
        ]);
        // c(2) holds 2, c(1) holds 2: taking one of c(1)'s would only swap them; c(2)'s own
        // oldest goes instead.
        assert_eq!(choose(&table, c(2), 4, 4), Choice::Evict(3));
        // c(2)'s own are busy: refused.
        let busy = held(&[
            (1, c(1), true),
            (2, c(1), true),
            (3, c(2), false),
            (4, c(2), false),
        ]);
        assert_eq!(choose(&busy, c(2), 4, 4), Choice::Refuse);
        // A client with none takes from the one holding 2.
        assert_eq!(choose(&table, c(3), 4, 4), Choice::Evict(1));
        // Nothing may go: refused.
        let table = held(&[(1, c(1), false), (2, c(1), false)]);
        assert_eq!(choose(&table, c(3), 4, 2), Choice::Refuse);
    }

    #[test]
    fn a_client_is_an_ipv4_address_or_an_ipv6_slash_64() {
        let a: IpAddr = "2001:db8:1:2::10".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::1".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::10".parse().unwrap();
        assert_eq!(Client::of(a), Client::of(b));
        assert_ne!(Client::of(a), Client::of(other));
        assert_eq!(Client::of(a).to_string(), "2001:db8:1:2::/64");
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(Client::of(mapped), c(1));
        assert_ne!(c(1), c(2));
    }

    #[tokio::test]
    async fn an_evicted_slot_is_told_how_and_its_place_is_free_at_once() {
        let slots = Slots::new(2, 3);
        let first = slots.take(c(1), false, Closing::Abort).expect("a slot");
        let busy = first.busy();
        let second = slots.take(c(1), false, Closing::Abort).expect("a slot");
        // c(1) at its limit: its idle one goes, not the busy one.
        let third = slots.take(c(1), false, Closing::Abort).expect("a slot");
        assert_eq!(second.closing().await, Closing::Abort);
        assert_eq!(slots.held(), 2);
        assert_eq!(slots.evicted(), 1);
        drop(second);
        assert_eq!(slots.held(), 2);
        // `first` no longer busy: it is c(1)'s oldest idle one, and goes as asked.
        drop(busy);
        let _fourth = slots.take(c(1), false, Closing::Graceful).expect("a slot");
        assert_eq!(first.closing().await, Closing::Graceful);
        drop(third);
        assert_eq!(slots.refused(), 0);
    }
}
