//! What a tracer run cost: its programs' kernel-measured runs and time, told apart by the
//! tracepoint each serves, and the tracer process's own CPU, memory and attach time.

use std::time::Duration;

use serde_json::Value;

use super::procfs::Prog;

/// Which tracepoint a program serves, from its kernel name (cut to 15 characters:
/// `mmap_lock_acqui`, `floor_start_loc`; bpftrace 0.17 names its programs the same way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tp {
    Start,
    Acquire,
    Released,
    /// `sched_process_exit`, `sched_process_free`: once per thread, not per lock event.
    Exit,
    /// Anything else (mmaplock-prof's flush iterator): not per lock event either.
    Other,
}

impl Tp {
    /// The mmap_lock tracepoints: their hits are the events.
    pub const LOCK: [Tp; 3] = [Tp::Start, Tp::Acquire, Tp::Released];

    pub fn of(prog_name: &str) -> Tp {
        let n = prog_name.to_ascii_lowercase();
        if n.starts_with("sched_process") || n.contains("exit") {
            Tp::Exit
        } else if n.contains("acq") {
            Tp::Acquire
        } else if n.contains("rel") {
            Tp::Released
        } else if n.contains("start") {
            Tp::Start
        } else {
            Tp::Other
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Tp::Start => "start_locking",
            Tp::Acquire => "acquire_returned",
            Tp::Released => "released",
            Tp::Exit => "exit programs",
            Tp::Other => "other programs",
        }
    }
}

/// One tracer run's measurements.
#[derive(Clone, Debug, Default)]
pub struct TracerCost {
    /// From starting the tracer to its programs' first counted run.
    pub attach: Duration,
    pub programs: Vec<Prog>,
    /// Userspace and kernel CPU time of the tracer process over `wall`.
    pub cpu: Duration,
    pub peak_rss_kib: u64,
    pub wall: Duration,
    /// mmaplock-prof's summary: acquisitions it reports as lost (all reasons).
    pub lost: Option<u64>,
    /// mmaplock-prof's summary: where its attach time went (`overhead.load`: steps, and each
    /// program's verification with the instructions the verifier processed).
    pub load: Option<Value>,
    /// mmaplock-prof's summary: its userspace work per sampled stack (`stack_work`).
    pub stack_work: Option<Value>,
}

impl TracerCost {
    /// Mmap_lock tracepoint hits: runs of the programs on those tracepoints.
    pub fn lock_events(&self) -> u64 {
        self.programs
            .iter()
            .filter(|p| Tp::LOCK.contains(&Tp::of(&p.name)))
            .map(|p| p.runs)
            .sum()
    }

    /// BPF time of all the tracer's programs (exit and iterator programs included) per
    /// mmap_lock tracepoint hit.
    pub fn ns_per_event(&self) -> f64 {
        let ns: u64 = self.programs.iter().map(|p| p.ns).sum();
        match self.lock_events() {
            0 => f64::NAN,
            e => ns as f64 / e as f64,
        }
    }

    /// Mean run time of the program(s) on one tracepoint.
    pub fn ns_per_run(&self, tp: Tp) -> f64 {
        let (runs, ns) = self
            .programs
            .iter()
            .filter(|p| Tp::of(&p.name) == tp)
            .fold((0u64, 0u64), |(r, n), p| (r + p.runs, n + p.ns));
        if runs == 0 {
            f64::NAN
        } else {
            ns as f64 / runs as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_told_apart_by_their_kernel_names() {
        // Kernel names are cut to 15 characters.
        assert_eq!(Tp::of("mmap_lock_start"), Tp::Start);
        assert_eq!(Tp::of("mmap_lock_acqui"), Tp::Acquire);
        assert_eq!(Tp::of("mmap_lock_relea"), Tp::Released);
        assert_eq!(Tp::of("sched_process_e"), Tp::Exit);
        assert_eq!(Tp::of("floor_start_loc"), Tp::Start);
        assert_eq!(Tp::of("clock_released"), Tp::Released);
        assert_eq!(Tp::of("clock_acquire_r"), Tp::Acquire);
        assert_eq!(Tp::of("sched_process_f"), Tp::Exit);
        assert_eq!(Tp::of("flush_threads"), Tp::Other);
        let cost = TracerCost {
            programs: vec![
                Prog {
                    id: 1,
                    name: "mmap_lock_start".into(),
                    runs: 10,
                    ns: 500,
                },
                Prog {
                    id: 2,
                    name: "mmap_lock_acqui".into(),
                    runs: 20,
                    ns: 600,
                },
                Prog {
                    id: 3,
                    name: "sched_process_e".into(),
                    runs: 1,
                    ns: 100,
                },
            ],
            ..TracerCost::default()
        };
        assert_eq!(cost.lock_events(), 30);
        // The exit program's time counts, its runs are not mmap_lock events.
        assert_eq!(cost.ns_per_event(), 40.0);
        assert_eq!(cost.ns_per_run(Tp::Acquire), 30.0);
        assert!(cost.ns_per_run(Tp::Released).is_nan());
    }
}
