//! When a profiled process's memory map is read: whole once per process (per exec image),
//! then only for an address that none of the mappings known covers (code loaded or compiled
//! since), and at most as often as token buckets per process allow, because every read of
//! the map may take the process's `mmap_lock` (see `query`):
//! - with `PROCMAP_QUERY` (6.11+), the mapping that covers the address is asked for alone:
//!   [`QUERY_BURST`] at once, then one per [`QUERY_EVERY`]. Unwinding needs no more; thread
//!   roles read the whole map after an answer of file-backed code (a library loaded since
//!   came with others: the addon behind it);
//! - without it, the whole map is read again: [`REREAD_BURST`] at once, then one per
//!   [`REREAD_EVERY`].
//!
//! An address asked about while the bucket is empty stays unknown (a stack then ends there,
//! `unknown_mapping`), and is asked about again by a later sample. The mappings are not kept
//! in step from the traced lock acquisitions: those carry no address (and only one write in
//! `--stack-sample` has its registers read), so an unmapped range stays known until a read of
//! the whole map replaces it, as before.

use std::time::{Duration, Instant};

use super::{Mapping, Maps, query};
use crate::registry::reads::Reads;

/// Queries (one mapping each) a process may have at once.
pub const QUERY_BURST: u32 = 16;
/// Then one more query per this.
pub const QUERY_EVERY: Duration = Duration::from_millis(50);
/// Reads of a whole map again a process may have at once.
pub const REREAD_BURST: u32 = 2;
/// Then one more per this.
pub const REREAD_EVERY: Duration = Duration::from_secs(1);

/// Tokens that come back one per `every`, up to `capacity`; full at first.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    capacity: u32,
    every: Duration,
    tokens: u32,
    /// When the last token came back (None: never taken from).
    since: Option<Instant>,
}

impl TokenBucket {
    pub fn new(capacity: u32, every: Duration) -> Self {
        TokenBucket {
            capacity,
            every,
            tokens: capacity,
            since: None,
        }
    }

    /// Takes a token at `now` (a clock that never goes back), if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let since = *self.since.get_or_insert(now);
        let back = now.saturating_duration_since(since).as_nanos() / self.every.as_nanos().max(1);
        if back > 0 {
            let back = u32::try_from(back).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(back).min(self.capacity);
            // A full bucket starts counting again now; otherwise the part of a period
            // already run is kept.
            self.since = Some(if self.tokens == self.capacity {
                now
            } else {
                since + self.every * back
            });
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

/// Which mappings a reader keeps: code only, since a process with ten thousand threads has
/// twenty thousand mappings, nearly all stacks and guard pages, none of which is looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Executable, file-backed or not (JIT code): what unwinding looks up.
    Exec,
    /// Executable and file-backed: where a start routine can be named.
    Code,
}

impl Keep {
    pub fn keeps(self, m: &Mapping) -> bool {
        m.exec && (self == Keep::Exec || m.path.is_some())
    }
}

/// Where a process's mappings come from (a trait so that tests count the reads).
pub trait Source {
    /// The whole map.
    fn read_all(&mut self) -> std::io::Result<Maps>;
    /// The whole map for a reader's first look, and whether it was read now (false: a read
    /// made moments ago for another reader of the process, see [`Proc`]).
    fn read_first(&mut self) -> std::io::Result<(Maps, bool)> {
        Ok((self.read_all()?, true))
    }
    /// The mapping that covers `addr` (Ok(None): none); None when the kernel cannot say.
    fn query(&mut self, addr: u64) -> Option<std::io::Result<Option<Mapping>>>;
}

/// `/proc/PID/maps` of a live process.
///
/// A reader's first look at a process (thread roles at its first thread, unwinding at its
/// first sampled stack, often a few hundred milliseconds apart) takes the whole map read for
/// another within [`SHARED_FOR`], rather than reading it again (on a contended node process
/// about 0.1-0.3 ms of CPU, and an acquisition of its lock before Linux 6.17). What is
/// mapped since is found as for any later address ([`Lookups::cover`]).
pub struct Proc(pub u32);

/// How long a whole map read serves other readers' first look.
const SHARED_FOR: Duration = Duration::from_secs(1);

/// Most mappings kept in all for [`SHARED_FOR`] (a process with ten thousand threads has
/// twenty thousand: a few megabytes).
const SHARED_MAPPINGS: usize = 50_000;

thread_local! {
    /// The last whole map read of the processes read within [`SHARED_FOR`], by pid (the
    /// registry reads from the run loop's thread only).
    static RECENT: std::cell::RefCell<Vec<(u32, Instant, Maps)>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

/// Forgets the map kept of `pid` for other readers: its image is another since (an exec).
pub fn forget_shared(pid: u32) {
    RECENT.with_borrow_mut(|r| r.retain(|(p, _, _)| *p != pid));
}

impl Source for Proc {
    fn read_all(&mut self) -> std::io::Result<Maps> {
        // Every reader keeps executable mappings only (`Keep`).
        let features = crate::kernel::features::Features::running();
        let maps = if features.unlocked_map_reads && query::supported() {
            Maps::read_executable(self.0)?
        } else {
            Maps::read(self.0)?
        };
        let now = Instant::now();
        RECENT.with_borrow_mut(|r| {
            r.retain(|(pid, at, _)| *pid != self.0 && now.duration_since(*at) < SHARED_FOR);
            r.push((self.0, now, maps.clone()));
            // The oldest go first past the bound (the newest is kept whatever its size).
            while r.len() > 1 && r.iter().map(|(_, _, m)| m.len()).sum::<usize>() > SHARED_MAPPINGS
            {
                r.remove(0);
            }
        });
        Ok(maps)
    }

    fn read_first(&mut self) -> std::io::Result<(Maps, bool)> {
        let recent = RECENT.with_borrow_mut(|r| {
            r.retain(|(_, at, _)| at.elapsed() < SHARED_FOR);
            (r.iter())
                .find(|(pid, _, _)| *pid == self.0)
                .map(|(_, _, m)| m.clone())
        });
        match recent {
            Some(m) => Ok((m, false)),
            None => Ok((self.read_all()?, true)),
        }
    }

    fn query(&mut self, addr: u64) -> Option<std::io::Result<Option<Mapping>>> {
        if !query::supported() {
            return None;
        }
        Some(query::MapsFile::open(self.0).and_then(|f| f.query(addr)))
    }
}

/// What [`Lookups::cover`] did for an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A mapping known covers it: nothing was read.
    Known,
    /// Its mapping was read and is known now.
    Added,
    /// It was looked up: no mapping kept covers it.
    Missing,
    /// Not looked up: the process's bucket is empty.
    Limited,
}

/// A process's lookups of addresses none of its known mappings covers, and what they cost.
#[derive(Clone, Debug)]
pub struct Lookups {
    queries: TokenBucket,
    rereads: TokenBucket,
    /// Whether the source answers queries (until it says it cannot).
    can_query: bool,
    /// Whether a mapping of file-backed code found by a query is read with the whole map.
    whole: bool,
    /// The whole map read (at first and again) and the queries made: `maps` and
    /// `map_queries`.
    pub reads: Reads,
}

/// The lookups of thread roles ([`Lookups::whole_map`]): they never leave out a mapping
/// loaded with the one asked for.
impl Default for Lookups {
    fn default() -> Self {
        Self::whole_map()
    }
}

impl Lookups {
    /// For unwinding: the mapping of an address is all it needs.
    pub fn one_mapping() -> Self {
        Lookups {
            queries: TokenBucket::new(QUERY_BURST, QUERY_EVERY),
            rereads: TokenBucket::new(REREAD_BURST, REREAD_EVERY),
            can_query: true,
            whole: false,
            reads: Reads::default(),
        }
    }

    /// For start routines: a library found by a query is read with the whole map (what else
    /// was loaded with it), an address of no file-backed code costs a query only.
    pub fn whole_map() -> Self {
        Lookups {
            whole: true,
            ..Self::one_mapping()
        }
    }

    /// The whole map at first: what `keep` keeps of it (counted when read now: see
    /// [`Source::read_first`]).
    pub fn read(&mut self, source: &mut impl Source, keep: Keep) -> std::io::Result<Maps> {
        let (maps, fresh) = source.read_first()?;
        if fresh {
            self.reads.maps += 1;
        }
        Ok(maps.retain(keep))
    }

    /// The whole map read again (counted, as every read is).
    fn reread(&mut self, source: &mut impl Source, keep: Keep) -> std::io::Result<Maps> {
        self.reads.maps += 1;
        Ok(source.read_all()?.retain(keep))
    }

    /// Makes `maps` (what `keep` keeps of `source`'s mappings) cover `addr` if it can, at
    /// `now`: the mapping that covers it asked for alone (then the whole map, for
    /// [`whole_map`](Self::whole_map) and file-backed code), or, without the query, the whole
    /// map read again, each only while its bucket allows.
    pub fn cover(
        &mut self,
        source: &mut impl Source,
        maps: &mut Maps,
        addr: u64,
        keep: Keep,
        now: Instant,
    ) -> Lookup {
        if maps.find(addr).is_some() {
            return Lookup::Known;
        }
        if self.can_query {
            if !self.queries.take(now) {
                return Lookup::Limited;
            }
            match source.query(addr) {
                Some(found) => {
                    self.reads.map_queries += 1;
                    match found {
                        Ok(Some(m)) if keep.keeps(&m) && !(self.whole && m.path.is_some()) => {
                            maps.insert(m);
                            return Lookup::Added;
                        }
                        // File-backed code, read below with the whole map.
                        Ok(Some(m)) if keep.keeps(&m) => {}
                        _ => return Lookup::Missing,
                    }
                }
                // No query on this kernel: the whole map instead, from now on.
                None => self.can_query = false,
            }
        }
        if !self.rereads.take(now) {
            return Lookup::Limited;
        }
        let Ok(all) = self.reread(source, keep) else {
            return Lookup::Missing;
        };
        *maps = all;
        if maps.find(addr).is_some() {
            Lookup::Added
        } else {
            Lookup::Missing
        }
    }
}

#[cfg(test)]
#[path = "live_tests.rs"]
mod tests;
