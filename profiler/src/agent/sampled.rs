//! What the agent makes of an interval's sampled stacks: each process's aggregate for the
//! `/debug/pprof/mmaplock` ring, labelled as its metrics are, and the interval line's sampled
//! writes (`dsos`), against which a scrape's totals can be checked.

use std::collections::BTreeMap;

use super::profiles::ProcessSampled;
use crate::{
    aggregation::{Attribution, ThreadAgg, Window},
    output::report::{self, ProcessReport, Report},
    registry::{
        roles::{Role, comm_str},
        stacks::OwnerStacks,
    },
    vocab::ids::{ProcId, ThreadId},
};

/// Each process's sampled stacks of the interval (the threads' roles and names as the window
/// knows them), with the labels `labels` gives it: the waiters' and the holders' (an interval
/// may have only holders', of read waits, which take no waiter's stack).
pub(super) fn interval_samples(
    owners: &BTreeMap<ProcId, OwnerStacks>,
    window: &Window,
    attribution: &Attribution,
    mut labels: impl FnMut(ProcId) -> Vec<(&'static str, String)>,
) -> Vec<ProcessSampled> {
    (owners.iter())
        .filter(|(_, o)| !o.samples.is_empty() || !o.holder_samples.is_empty())
        .map(|(&p, o)| {
            let threads = window.processes.get(&p);
            let stacks =
                report::sampled_stacks_by(o, |tid| thread_of(p, tid, threads, attribution));
            ProcessSampled {
                proc: p,
                labels: labels(p),
                exe: attribution.exe(p).map(str::to_string),
                stacks,
            }
        })
        .collect()
}

/// A sampled thread's role and name, as the window knows it (`other` when it does not).
fn thread_of(
    p: ProcId,
    tid: u32,
    threads: Option<&BTreeMap<ThreadId, ThreadAgg>>,
    attribution: &Attribution,
) -> (Role, String) {
    let found = threads.and_then(|m| m.iter().rev().find(|(t, _)| t.tid == tid));
    match found {
        Some((&t, agg)) => (attribution.role(p, t, agg), comm_str(&agg.comm)),
        None => (Role::Other, String::new()),
    }
}

/// An interval line's sampled writes by code (`dsos`), so that what a scrape of
/// `/debug/pprof/mmaplock` counts can be checked against the agent's NDJSON; a process whose
/// samples came without any acquisition in the interval gets an entry of its own.
pub(super) fn add_sampled_writes(
    r: &mut Report,
    owners: &BTreeMap<ProcId, OwnerStacks>,
    mut name: impl FnMut(ProcId) -> String,
) {
    for p in &mut r.processes {
        let o = owners.get(&ProcId::new(p.pid, p.start_ticks));
        p.dsos = Some(report::dso_reports(o));
    }
    for (&id, o) in owners {
        let listed = (r.processes.iter()).any(|p| ProcId::new(p.pid, p.start_ticks) == id);
        if !listed && !o.dsos.is_empty() {
            r.processes.push(ProcessReport {
                pid: id.pid,
                start_ticks: id.start,
                comm: name(id),
                dsos: Some(report::dso_reports(Some(o))),
                ..ProcessReport::default()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::stacks::{SampleKey, StackAgg};

    /// Read waits take only their holder's stack: an interval with nothing else still gives
    /// its holders' samples to `/debug/pprof/mmaplock` (they were dropped with the process).
    #[test]
    fn an_interval_with_only_holders_samples_keeps_them() {
        let p = ProcId::new(100, 7);
        let mut o = OwnerStacks::default();
        let key = SampleKey {
            tid: 101,
            cause: 1,
            frames: Vec::new(),
        };
        let agg = StackAgg {
            count: 3,
            wait_ns_sum: 9_000,
            hold_ns_sum: 0,
        };
        o.holder_samples.insert(key, agg);
        let owners = BTreeMap::from([(p, o)]);
        let got = interval_samples(&owners, &Window::default(), &Attribution::default(), |_| {
            Vec::new()
        });
        let [got] = &got[..] else {
            panic!("{} processes", got.len())
        };
        assert_eq!(got.proc, p);
        let holders: Vec<_> = got.stacks.stacks.iter().filter(|r| r.holder).collect();
        assert_eq!(holders.len(), 1);
        assert_eq!((holders[0].count, holders[0].wait_ns_sum), (3, 9_000));
    }
}
