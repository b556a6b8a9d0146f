//! Who made whom wait: the kernel charges each contended wait to the holds that overlapped it
//! (`BLOCKED`, cumulative per (lock, waiter, holder, holder's kind, waiter's op)); here those
//! counters become per-interval deltas and run totals, per lock owner.

use std::collections::BTreeMap;

use profiler_common::{BlockedKey, BlockedVal, COMM_LEN};
use rustc_hash::FxHashMap as HashMap;

use crate::vocab::ids::{ProcId, ThreadId, ticks_of_ns};

/// One (waiter, holder) pair on one lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pair {
    pub waiter: ThreadId,
    /// `profiler_common::READ` or `WRITE`: what the waiter waited for.
    pub waiter_op: u32,
    pub holder: ThreadId,
    /// The holder's process (differs from the lock's owner for a foreign holder).
    pub holder_pid: u32,
    /// The holder's hold: `cause::READ`, a write cause, or `cause::DOWNGRADE`.
    pub holder_kind: u32,
}

/// What a pair's waits came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charged {
    /// Waits the holder's holds overlapped.
    pub waits: u64,
    /// The part of those waits charged to the holder, ns.
    pub wait_ns: u64,
}

impl Charged {
    fn add(&mut self, o: Charged) {
        self.waits += o.waits;
        self.wait_ns += o.wait_ns;
    }
}

/// Charged waits per lock owner, then per pair.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blocked {
    pub owners: BTreeMap<ProcId, BTreeMap<Pair, Charged>>,
    /// Holders' command names as the kernel saw them (they may not be in the window's
    /// threads: a hold can end in an interval where its thread took nothing else).
    pub holder_comms: BTreeMap<ThreadId, [u8; COMM_LEN]>,
}

impl Blocked {
    pub fn add(&mut self, owner: ProcId, pair: Pair, c: Charged) {
        self.owners
            .entry(owner)
            .or_default()
            .entry(pair)
            .or_default()
            .add(c);
    }

    pub fn merge(&mut self, o: &Blocked) {
        for (&owner, pairs) in &o.owners {
            for (&pair, &c) in pairs {
                self.add(owner, pair, c);
            }
        }
        for (t, c) in &o.holder_comms {
            self.holder_comms.entry(*t).or_insert(*c);
        }
    }

    /// Forgets a lock that is gone.
    pub fn forget_owner(&mut self, owner: ProcId) {
        self.owners.remove(&owner);
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }
}

/// The ids of a kernel key: the lock's owner and the pair.
pub fn pair_of(k: &BlockedKey) -> (ProcId, Pair) {
    (
        ProcId::new(k.owner, ticks_of_ns(k.owner_start)),
        Pair {
            waiter: ThreadId::new(k.waiter_tid, ticks_of_ns(k.waiter_start)),
            waiter_op: k.waiter_op,
            holder: ThreadId::new(k.holder_tid, ticks_of_ns(k.holder_start)),
            holder_pid: k.holder_tgid,
            holder_kind: k.holder_kind,
        },
    )
}

/// The previous reading of each kernel entry, to diff the next one against.
#[derive(Default)]
pub struct BlockedReadings {
    prev: HashMap<BlockedKey, BlockedVal>,
}

impl BlockedReadings {
    /// Folds a full reading of the kernel map into `into` as deltas since the previous one.
    pub fn update(&mut self, snapshot: &[(BlockedKey, BlockedVal)], into: &mut Blocked) {
        for (k, v) in snapshot {
            let prev = self.prev.insert(*k, *v).unwrap_or_default();
            let d = Charged {
                waits: v.waits.wrapping_sub(prev.waits),
                wait_ns: v.wait_ns.wrapping_sub(prev.wait_ns),
            };
            if d.waits != 0 || d.wait_ns != 0 {
                let (owner, pair) = pair_of(k);
                into.add(owner, pair, d);
            }
        }
    }

    /// Kernel keys that belong to `owner`'s lock (to delete when it is gone), forgotten here.
    pub fn take_owner(&mut self, owner: ProcId) -> Vec<BlockedKey> {
        self.take(|k| pair_of(k).0 == owner)
    }

    /// Kernel keys whose waiter is `waiter` (to delete when it has exited), forgotten here.
    pub fn take_waiter(&mut self, waiter: ThreadId) -> Vec<BlockedKey> {
        self.take(|k| pair_of(k).1.waiter == waiter)
    }

    fn take(&mut self, f: impl Fn(&BlockedKey) -> bool) -> Vec<BlockedKey> {
        let keys: Vec<BlockedKey> = self.prev.keys().filter(|k| f(k)).copied().collect();
        for k in &keys {
            self.prev.remove(k);
        }
        keys
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.prev.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::{WRITE, cause};

    fn key(waiter: u32, holder: u32, kind: u32) -> BlockedKey {
        BlockedKey {
            owner: 10,
            waiter_tid: waiter,
            holder_tid: holder,
            holder_tgid: 10,
            holder_kind: kind,
            waiter_op: WRITE as u32,
            owner_start: 0,
            waiter_start: 0,
            holder_start: 0,
        }
    }

    #[test]
    fn readings_become_deltas_and_owners_are_forgotten() {
        let mut r = BlockedReadings::default();
        let mut w = Blocked::default();
        let k = key(11, 12, cause::MPROTECT);
        r.update(
            &[(
                k,
                BlockedVal {
                    waits: 2,
                    wait_ns: 500,
                },
            )],
            &mut w,
        );
        let mut w2 = Blocked::default();
        r.update(
            &[(
                k,
                BlockedVal {
                    waits: 5,
                    wait_ns: 800,
                },
            )],
            &mut w2,
        );
        let (owner, pair) = pair_of(&k);
        assert_eq!(
            w.owners[&owner][&pair],
            Charged {
                waits: 2,
                wait_ns: 500
            }
        );
        assert_eq!(
            w2.owners[&owner][&pair],
            Charged {
                waits: 3,
                wait_ns: 300
            }
        );
        // An unchanged reading adds nothing.
        let mut w3 = Blocked::default();
        r.update(
            &[(
                k,
                BlockedVal {
                    waits: 5,
                    wait_ns: 800,
                },
            )],
            &mut w3,
        );
        assert!(w3.is_empty());
        w.merge(&w2);
        assert_eq!(w.owners[&owner][&pair].wait_ns, 800);
        assert_eq!(r.take_waiter(pair.waiter), vec![k]);
        assert_eq!(r.len(), 0);
    }
}
