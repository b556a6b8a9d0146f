//! The line ends of application scripts, shared by the isolates (and processes) that loaded
//! the same source. A pool that starts a fresh Worker per task loads the same files into each
//! new isolate, each its own copy of the source in its own heap; reading each copy whole to
//! place its functions' definitions was the longest hold of the target's lock the profiler
//! made (tens of microseconds for a large module, some milliseconds for a bundle). A copy is
//! taken for one already read when its script's name and length and its first and last
//! [`PROBE_UNITS`] code units are the same: two small reads instead of the whole source.
//! Line ends depend only on where the line terminators are, so a source edited in place
//! without moving any (a constant changed) shares them rightly too.

use std::{cell::RefCell, collections::HashMap, rc::Rc, sync::Arc};

use super::{
    V8Process,
    memory::Memory,
    names::{LineEndsFrom, line_ends},
};

/// Code units compared at each end of a source.
pub const PROBE_UNITS: usize = 1024;
/// Sources shorter than this are read whole (the probe would not save a read).
pub const SHARED_MIN_UNITS: usize = 16 * PROBE_UNITS;
/// Line ends and probes' code units held in all (4 and 2 bytes each): past it the sharing
/// starts again empty (at most about 16 MiB, however many sources).
const MAX_SHARED_UNITS: usize = 4 << 20;

/// Line ends of application scripts by name and length, with the probes they were read with.
/// One per run (the registry's, an agent's for as long as it runs): cloned, it is the same.
#[derive(Clone, Default)]
pub struct ScriptSources(Rc<RefCell<Shared>>);

#[derive(Default)]
struct Shared {
    /// By script name and source length: each source read, by its probe.
    by_source: HashMap<(String, usize), Vec<Read>>,
    held: usize,
}

/// A source read whole: its first and last [`PROBE_UNITS`] code units, and its line ends.
type Read = (Vec<u16>, Arc<Vec<i32>>);

impl ScriptSources {
    /// Whether a source of this name and length was read before (then a probe may find it).
    fn known(&self, name: &str, len: usize) -> bool {
        (self.0.borrow().by_source).contains_key(&(name.to_string(), len))
    }

    fn find(&self, name: &str, len: usize, probe: &[u16]) -> Option<Arc<Vec<i32>>> {
        let shared = self.0.borrow();
        let variants = shared.by_source.get(&(name.to_string(), len))?;
        variants
            .iter()
            .find(|(p, _)| p == probe)
            .map(|(_, ends)| Arc::clone(ends))
    }

    fn insert(&self, name: &str, len: usize, probe: Vec<u16>, ends: Arc<Vec<i32>>) {
        let mut shared = self.0.borrow_mut();
        let units = ends.len() + probe.len();
        if shared.held + units > MAX_SHARED_UNITS {
            *shared = Shared::default();
        }
        shared.held += units;
        (shared.by_source.entry((name.to_string(), len)).or_default()).push((probe, ends));
    }
}

/// A source's first and last [`PROBE_UNITS`] code units, from the whole source.
fn probe_of(units: &[u16]) -> Vec<u16> {
    let n = PROBE_UNITS.min(units.len());
    let mut p = units[..n].to_vec();
    p.extend_from_slice(&units[units.len() - n..]);
    p
}

impl<M: Memory> V8Process<M> {
    /// The line ends of script `script`, named `name`, that is not node's own: V8's when it
    /// computed them, else from its source, shared with the isolates that loaded the same
    /// ([`ScriptSources`]). Empty when they cannot be read.
    pub(super) fn script_ends(&mut self, script: u64, name: &str) -> Arc<Vec<i32>> {
        let from = self.heap().script_line_ends(script);
        let (string, len) = match from {
            Some(LineEndsFrom::Source { string, len }) => (string, len),
            Some(LineEndsFrom::Computed(ends)) => return Arc::new(ends),
            None => return Arc::default(),
        };
        let shared =
            (!name.is_empty() && len >= SHARED_MIN_UNITS).then(|| self.shared_scripts.clone());
        if let Some(sources) = &shared
            && sources.known(name, len)
        {
            let h = self.heap();
            let probe = h.units_range(string, 0, PROBE_UNITS).zip(h.units_range(
                string,
                len - PROBE_UNITS,
                PROBE_UNITS,
            ));
            if let Some((mut head, tail)) = probe {
                head.extend(tail);
                if let Some(ends) = sources.find(name, len, &head) {
                    log::debug!("{name}: {len} code units, line ends of another isolate's copy");
                    self.stats.sources_shared += 1;
                    return ends;
                }
            }
        }
        let Some(units) = self.heap().units(string, super::heap::MAX_SOURCE) else {
            return Arc::default();
        };
        log::debug!("{name}: {len} code units read whole for their line ends");
        let ends = Arc::new(line_ends(&units));
        if let Some(sources) = shared
            && units.len() == len
        {
            sources.insert(name, len, probe_of(&units), Arc::clone(&ends));
        }
        ends
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many long one-line sources (one line end each, the probes most of what is held) keep
    /// the sharing bounded: it starts again empty rather than grow.
    #[test]
    fn what_is_shared_stays_bounded_however_many_sources() {
        let sources = ScriptSources::default();
        let probe = vec![b'x' as u16; 2 * PROBE_UNITS];
        for i in 0..5_000 {
            let name = format!("/app/bundle-{i}.js");
            sources.insert(&name, SHARED_MIN_UNITS, probe.clone(), Arc::new(vec![0]));
            assert!(sources.0.borrow().held <= MAX_SHARED_UNITS);
        }
        assert!(!sources.known("/app/bundle-0.js", SHARED_MIN_UNITS));
        assert!(sources.known("/app/bundle-4999.js", SHARED_MIN_UNITS));
    }
}
