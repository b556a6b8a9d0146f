//! "Who made whom wait" in a report: each process's blockers (the threads whose holds its
//! waiters waited behind, with the wait charged to them) and each thread's `blocked_by`.
//! Pure functions of the window's charged waits and the attribution's roles.

use std::{borrow::Cow, collections::BTreeMap};

use profiler_common::{WRITE, cause};
use serde::{Deserialize, Serialize};

use crate::{
    aggregation::Attribution,
    aggregation::{
        ThreadAgg,
        blocked::{Charged, Pair},
    },
    registry::roles::{Role, comm_str},
    vocab::ids::{ProcId, ThreadId},
};

/// A thread whose holds made others wait, and how much of their wait is charged to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockerReport {
    pub tid: u32,
    /// The holder's process (the lock's owner, or another process for a foreign holder).
    pub pid: u32,
    pub role: Role,
    pub comm: String,
    /// What its holds were: a write cause, `read`, or `downgrade` (a munmap's read hold after
    /// its write lock was downgraded).
    pub cause: Cow<'static, str>,
    /// Waits its holds overlapped.
    pub waits: u64,
    /// The part of those waits charged to it, ns.
    pub wait_ns: u64,
    /// `write` waits only: the part of `wait_ns` that writers waited.
    pub write_wait_ns: u64,
}

/// How many blockers a process lists, and a thread.
const TOP_PROCESS: usize = 20;
const TOP_THREAD: usize = 10;

/// The blockers of one lock: for the process, and per waiting thread.
pub struct LockBlockers {
    pub process: Vec<BlockerReport>,
    pub threads: BTreeMap<ThreadId, Vec<BlockerReport>>,
    /// Everything charged on this lock, ns (to tell the charged part of the waits).
    pub charged_ns: u64,
}

/// Role of a thread of `owner`'s lock: from the window's thread entry (a retired thread
/// carries its own), else the attribution, else `other`; a thread of another process is
/// `foreign`, but for the profiler's own.
fn role_of(
    owner: ProcId,
    t: ThreadId,
    pid: u32,
    threads: Option<&BTreeMap<ThreadId, ThreadAgg>>,
    attribution: &Attribution,
) -> Role {
    // Contention mode's holder of a lock its readers held (the rwsem names none of them).
    if t.tid == 0 && pid == 0 {
        return Role::Readers;
    }
    let decided = match threads.and_then(|m| m.get(&t)) {
        Some(agg) => Some(attribution.role(owner, t, agg)),
        None => attribution.role_of(owner, t),
    };
    if decided == Some(Role::Profiler) {
        return Role::Profiler;
    }
    if pid != owner.pid {
        return Role::Foreign;
    }
    decided.unwrap_or(if t.tid == owner.pid {
        Role::Main
    } else {
        Role::Other
    })
}

/// Whether the waiter of a pair is one of the profiler's own threads: its waits are no part
/// of the process's (`read` and `write` leave them out), so neither are their charges.
fn profilers_wait(
    owner: ProcId,
    p: &Pair,
    threads: Option<&BTreeMap<ThreadId, ThreadAgg>>,
    attribution: &Attribution,
) -> bool {
    let pid = threads
        .and_then(|m| m.get(&p.waiter))
        .map_or(owner.pid, |a| a.tgid);
    role_of(owner, p.waiter, pid, threads, attribution) == Role::Profiler
}

/// Groups `owner`'s charged waits by holder (and its hold's cause): for the process (the
/// waits its `read` and `write` count: the profiler's own are left out), and for each waiter.
pub fn lock_blockers(
    owner: ProcId,
    pairs: &BTreeMap<Pair, Charged>,
    threads: Option<&BTreeMap<ThreadId, ThreadAgg>>,
    holder_comms: &BTreeMap<ThreadId, [u8; profiler_common::COMM_LEN]>,
    attribution: &Attribution,
) -> LockBlockers {
    type Holder = (ThreadId, u32, u32);
    let mut by_holder: BTreeMap<Holder, (Charged, u64)> = BTreeMap::new();
    let mut by_waiter: BTreeMap<ThreadId, BTreeMap<Holder, (Charged, u64)>> = BTreeMap::new();
    let mut charged_ns = 0;
    for (p, c) in pairs {
        let h = (p.holder, p.holder_pid, p.holder_kind);
        let w = if p.waiter_op == WRITE as u32 {
            c.wait_ns
        } else {
            0
        };
        let add = |slot: &mut (Charged, u64)| {
            slot.0.waits += c.waits;
            slot.0.wait_ns += c.wait_ns;
            slot.1 += w;
        };
        add(by_waiter.entry(p.waiter).or_default().entry(h).or_default());
        if profilers_wait(owner, p, threads, attribution) {
            continue;
        }
        add(by_holder.entry(h).or_default());
        charged_ns += c.wait_ns;
    }
    let report = |m: BTreeMap<Holder, (Charged, u64)>, top: usize| {
        let mut v: Vec<BlockerReport> = m
            .into_iter()
            .map(|((t, pid, kind), (c, w))| BlockerReport {
                tid: t.tid,
                pid,
                role: role_of(owner, t, pid, threads, attribution),
                comm: threads
                    .and_then(|m| m.get(&t))
                    .map(|a| comm_str(&a.comm))
                    .or_else(|| holder_comms.get(&t).map(comm_str))
                    .unwrap_or_default(),
                cause: cause::name(kind).into(),
                waits: c.waits,
                wait_ns: c.wait_ns,
                write_wait_ns: w,
            })
            .collect();
        v.sort_by(|a, b| (b.wait_ns, a.tid, &a.cause).cmp(&(a.wait_ns, b.tid, &b.cause)));
        v.truncate(top);
        v
    };
    LockBlockers {
        process: report(by_holder, TOP_PROCESS),
        threads: by_waiter
            .into_iter()
            .map(|(t, m)| (t, report(m, TOP_THREAD)))
            .collect(),
        charged_ns,
    }
}

/// "Who made whom wait" by role: the waits of one role's threads charged to another role's
/// holds of one cause.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleBlock {
    pub waiter_role: Role,
    pub holder_role: Role,
    pub cause: Cow<'static, str>,
    /// Waits (write and read) charged, ns.
    pub wait_ns: u64,
    /// The part of `wait_ns` that writers waited.
    pub write_wait_ns: u64,
}

/// A lock's charged waits by (waiter role, holder role, holder cause), largest wait (write
/// and read) first (the profiler's own waits left out, as in [`lock_blockers`]).
pub fn by_role(
    owner: ProcId,
    pairs: &BTreeMap<Pair, Charged>,
    threads: Option<&BTreeMap<ThreadId, ThreadAgg>>,
    attribution: &Attribution,
) -> Vec<RoleBlock> {
    let mut m: BTreeMap<(Role, Role, &'static str), (u64, u64)> = BTreeMap::new();
    for (p, c) in pairs
        .iter()
        .filter(|(p, _)| !profilers_wait(owner, p, threads, attribution))
    {
        let waiter_pid = threads
            .and_then(|m| m.get(&p.waiter))
            .map_or(owner.pid, |a| a.tgid);
        let wr = role_of(owner, p.waiter, waiter_pid, threads, attribution);
        let hr = role_of(owner, p.holder, p.holder_pid, threads, attribution);
        let e = m.entry((wr, hr, cause::name(p.holder_kind))).or_default();
        e.0 += c.wait_ns;
        if p.waiter_op == WRITE as u32 {
            e.1 += c.wait_ns;
        }
    }
    let mut v: Vec<RoleBlock> = m
        .into_iter()
        .map(|((w, h, c), (all, writes))| RoleBlock {
            waiter_role: w,
            holder_role: h,
            cause: c.into(),
            wait_ns: all,
            write_wait_ns: writes,
        })
        .collect();
    v.sort_by_key(|r| std::cmp::Reverse((r.wait_ns, r.write_wait_ns)));
    v
}

/// The rows of "who made whom wait" a view shows: the `top` that waited longest (write and
/// read), then, for every waiting role not among them, its largest row: no role's wait is
/// out of sight, however small beside the others'. Largest first; rows of no wait left out.
pub fn shown_rows(roles: &[RoleBlock], top: usize) -> Vec<&RoleBlock> {
    let mut rows: Vec<&RoleBlock> = roles.iter().filter(|r| r.wait_ns > 0).collect();
    rows.sort_by_key(|r| std::cmp::Reverse((r.wait_ns, r.write_wait_ns)));
    let mut shown: Vec<&RoleBlock> = rows.iter().take(top).copied().collect();
    for r in rows.iter().skip(top) {
        if !shown.iter().any(|s| s.waiter_role == r.waiter_role) {
            shown.push(r);
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::READ;

    #[test]
    fn a_long_holder_is_charged_the_waits_of_everyone_queued_behind_it() {
        let owner = ProcId::new(100, 1);
        let [long, a, b] = ThreadId::made_up([101, 102, 103]);
        let mut pairs = BTreeMap::new();
        let pair = |waiter, holder, kind, op| Pair {
            waiter,
            waiter_op: op,
            holder,
            holder_pid: 100,
            holder_kind: kind,
        };
        let c = |waits, wait_ns| Charged { waits, wait_ns };
        pairs.insert(pair(a, long, cause::MPROTECT, WRITE as u32), c(3, 9_000));
        pairs.insert(pair(b, long, cause::MPROTECT, WRITE as u32), c(3, 8_000));
        pairs.insert(pair(b, a, cause::MMAP, WRITE as u32), c(2, 100));
        pairs.insert(pair(a, b, cause::READ, READ as u32), c(1, 50));
        let attribution = Attribution::with(&[], &[(owner, long, Role::Worker)]);
        let lb = lock_blockers(owner, &pairs, None, &BTreeMap::new(), &attribution);
        let top = &lb.process[0];
        assert_eq!(
            (top.tid, top.role, top.cause.as_ref()),
            (101, Role::Worker, "mprotect")
        );
        assert_eq!(
            (top.waits, top.wait_ns, top.write_wait_ns),
            (6, 17_000, 17_000)
        );
        assert_eq!(lb.charged_ns, 17_150);
        assert_eq!(lb.threads[&b][0].tid, 101);
        assert_eq!(lb.threads[&b][1].wait_ns, 100);
        assert_eq!(lb.threads[&a].len(), 2);
        // A read hold's charge is wait, not write wait.
        let read = lb.threads[&a].iter().find(|r| r.cause == "read").unwrap();
        assert_eq!((read.wait_ns, read.write_wait_ns), (50, 0));
        let roles = by_role(owner, &pairs, None, &attribution);
        assert_eq!(
            roles[0],
            RoleBlock {
                waiter_role: Role::Other,
                holder_role: Role::Worker,
                cause: "mprotect".into(),
                wait_ns: 17_000,
                write_wait_ns: 17_000
            }
        );
    }

    /// The rows shown are the longest waits, reads' as writes', and every waiting role's
    /// largest, past the top ones.
    #[test]
    fn every_waiting_role_has_a_row_shown_the_longest_wait_first() {
        let row = |w: Role, h: Role, cause: &'static str, wait_ns, write_wait_ns| RoleBlock {
            waiter_role: w,
            holder_role: h,
            cause: cause.into(),
            wait_ns,
            write_wait_ns,
        };
        let roles = vec![
            // Addon threads' reads behind addon writes: the largest, no write wait at all.
            row(Role::Addon, Role::Libuv, "mmap", 1_940, 0),
            row(Role::Libuv, Role::Addon, "read", 900, 900),
            row(Role::Libuv, Role::Libuv, "mprotect", 800, 800),
            row(Role::Main, Role::Libuv, "mmap", 5, 5),
            row(Role::Worker, Role::Libuv, "mmap", 0, 0),
        ];
        let shown = shown_rows(&roles, 2);
        let got: Vec<(Role, u64)> = shown.iter().map(|r| (r.waiter_role, r.wait_ns)).collect();
        assert_eq!(
            got,
            [(Role::Addon, 1_940), (Role::Libuv, 900), (Role::Main, 5)],
            "the top two, then main's one row; libuv's smaller row and a row of no wait left out"
        );
    }

    /// The profiler's own waits behind a holder are its thread's, not the process's: charged
    /// to no blocker of the process and in no sum of its, so what is charged never exceeds
    /// what the process's threads waited.
    #[test]
    fn the_profilers_own_waits_are_not_the_processs() {
        let owner = ProcId::new(100, 1);
        let [holder, worker, ours] = ThreadId::made_up([101, 102, 7001]);
        let pair = |waiter, op| Pair {
            waiter,
            waiter_op: op,
            holder,
            holder_pid: 100,
            holder_kind: cause::MPROTECT,
        };
        let mut pairs = BTreeMap::new();
        pairs.insert(
            pair(worker, WRITE as u32),
            Charged {
                waits: 2,
                wait_ns: 900,
            },
        );
        pairs.insert(
            pair(ours, READ as u32),
            Charged {
                waits: 5,
                wait_ns: 4_000,
            },
        );
        let attribution = Attribution::with(
            &[],
            &[(owner, holder, Role::Worker), (owner, ours, Role::Profiler)],
        );
        let lb = lock_blockers(owner, &pairs, None, &BTreeMap::new(), &attribution);
        assert_eq!(lb.charged_ns, 900);
        assert_eq!((lb.process[0].waits, lb.process[0].wait_ns), (2, 900));
        // Its own thread still says what it waited behind.
        assert_eq!(lb.threads[&ours][0].wait_ns, 4_000);
        let roles = by_role(owner, &pairs, None, &attribution);
        assert_eq!(roles.len(), 1);
        assert_eq!(roles[0].wait_ns, 900);
    }
}
