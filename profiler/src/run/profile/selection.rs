//! Why each process is profiled: how the kernel's selection took it in (at exec, at a
//! rename, at fork, or put there at the start) and by which selector, read at each reading
//! (before a gone process leaves the selection), named for the reports' `selected_by`.

use rustc_hash::FxHashMap as HashMap;

use super::Profile;
use crate::{
    kernel::{
        Kernel,
        selection::{How, Selected},
    },
    output::report::{Report, SelectedBy, SelectedHow},
    vocab::ids::{Presence, ProcId, ThreadId},
};

/// What a run knows of its selection.
#[derive(Default)]
pub(super) struct Selections {
    /// The `--comm` names, in the kernel's order (a selector's number + 1 is its index + 1).
    comms: Vec<String>,
    /// The `--pid` targets.
    targets: Vec<ProcId>,
    /// The targets are the COMMAND the profiler ran.
    command: bool,
    by: HashMap<ProcId, SelectedBy>,
}

impl Selections {
    fn describe(&self, s: &Selected) -> SelectedBy {
        let comm = usize::from(s.selector)
            .checked_sub(1)
            .and_then(|i| self.comms.get(i))
            .cloned();
        let p = ProcId::new(s.pid, s.ticks);
        let pid = (!s.by_rule && s.how == How::Set && self.targets.contains(&p)).then_some(s.pid);
        let how = match s.how {
            How::Set if pid.is_some() && self.command => SelectedHow::Command,
            How::Set => SelectedHow::Running,
            How::Exec => SelectedHow::Exec,
            How::Rename => SelectedHow::Rename,
            How::Fork => SelectedHow::Fork,
        };
        SelectedBy { comm, pid, how }
    }

    /// Notes the kernel's selection as it stands. What the kernel did (an exec, a rename, a
    /// fork) is the latest word on a process; what userspace put there at the start is
    /// noted once (as it was, before the kernel's word if any).
    fn note(&mut self, selection: &[Selected]) {
        for s in selection {
            let p = ProcId::new(s.pid, s.ticks);
            if s.how == How::Set && self.by.contains_key(&p) {
                continue;
            }
            let by = self.describe(s);
            self.by.insert(p, by);
        }
    }
}

impl<K: Kernel> Profile<K> {
    /// Names the run's selectors, so that its reports say why each process is in them:
    /// `comms`, the `--comm` names as the kernel numbers them; `targets`, the `--pid`
    /// processes.
    pub fn name_selection(&mut self, comms: Vec<String>, targets: &[ProcId], command: bool) {
        let mut s = Selections {
            comms,
            targets: targets.to_vec(),
            command,
            by: HashMap::default(),
        };
        for &p in targets {
            s.by.insert(
                p,
                SelectedBy {
                    comm: None,
                    pid: Some(p.pid),
                    how: if command {
                        SelectedHow::Command
                    } else {
                        SelectedHow::Running
                    },
                },
            );
        }
        self.selections = Some(s);
        self.note_selection(false);
    }

    /// Notes the kernel's selection now (when the run names it). `prune`: also takes out of
    /// it the processes gone without the profile retiring them (selected, then gone without
    /// one acquisition read: a process found running that never locked), so that the
    /// kernel's map never fills with them.
    pub(super) fn note_selection(&mut self, prune: bool) {
        let Some(s) = self.selections.as_mut() else {
            return;
        };
        let selection = self.collector.selection();
        s.note(&selection);
        if prune {
            for x in selection {
                let main = ThreadId::new(x.pid, x.ticks);
                if self.collector.presence(x.pid, main) == Presence::Gone {
                    self.collector.deselect(x.pid, x.ticks);
                }
            }
        }
    }

    /// Says in `r` why each of its processes is profiled.
    pub(super) fn label_selection(&self, r: &mut Report) {
        let Some(s) = &self.selections else {
            return;
        };
        for p in &mut r.processes {
            p.selected_by = s.by.get(&ProcId::new(p.pid, p.start_ticks)).cloned();
        }
    }
}

#[cfg(test)]
mod tests {
    use profiler_common::cause;

    use super::*;
    use crate::kernel::fake::{FakeKernel, Task};

    const PID: u32 = 5_100_001;

    fn selected_by(r: &Report, t: &Task) -> Option<SelectedBy> {
        let p = t.process();
        let found = r
            .processes
            .iter()
            .find(|x| x.pid == p.pid && x.start_ticks == p.start);
        found.expect("in the report").selected_by.clone()
    }

    fn by(comm: Option<&str>, pid: Option<u32>, how: SelectedHow) -> Option<SelectedBy> {
        Some(SelectedBy {
            comm: comm.map(str::to_string),
            pid,
            how,
        })
    }

    /// Each process says which selector chose it and how, as the kernel noted it: at exec,
    /// at a rename, running at the start (by name or as a `--pid` target), at fork; an exec
    /// is the latest word, a process gone before the summary keeps its word, and a report
    /// of a run that names no selection says nothing.
    #[test]
    fn each_process_says_how_the_selection_took_it_in() {
        let mut p = Profile::new(FakeKernel::new(false), true);
        let k = &mut p.collector;
        let exec = k.spawn_process(PID, "node");
        let running = k.spawn_process(PID + 1, "myapp");
        let target = k.spawn_process(PID + 2, "python3");
        let renamed = k.spawn_process(PID + 3, "myapp");
        let child = k.spawn_process(PID + 4, "node");
        for t in [&exec, &running, &target, &renamed, &child] {
            k.take(t, cause::MMAP, 1);
        }
        // The start: one found running under a name, the target by its pid.
        k.select(&running, How::Set, 2);
        k.select(&target, How::Set, 0);
        p.name_selection(
            vec!["node".into(), "myapp".into()],
            &[target.process()],
            false,
        );
        let k = &mut p.collector;
        k.select(&exec, How::Exec, 1);
        k.select(&renamed, How::Rename, 2);
        k.select(&child, How::Fork, 1);
        p.poll(false).unwrap();
        let r = p.interval_report();
        assert_eq!(
            selected_by(&r, &exec),
            by(Some("node"), None, SelectedHow::Exec)
        );
        assert_eq!(
            selected_by(&r, &running),
            by(Some("myapp"), None, SelectedHow::Running)
        );
        assert_eq!(
            selected_by(&r, &target),
            by(None, Some(PID + 2), SelectedHow::Running)
        );
        assert_eq!(
            selected_by(&r, &renamed),
            by(Some("myapp"), None, SelectedHow::Rename)
        );
        assert_eq!(
            selected_by(&r, &child),
            by(Some("node"), None, SelectedHow::Fork)
        );

        // The forked child execs what the names select: selected at its exec now. The one
        // selected at exec exits and is reaped before the next reading, which retires it
        // (out of the kernel's selection) after noting it.
        p.collector.select(&child, How::Exec, 1);
        p.collector.exit(&exec);
        p.poll(false).unwrap();
        assert!(!p.collector.selection().iter().any(|s| s.pid == PID));
        let s = p.summary();
        assert_eq!(
            selected_by(&s, &child),
            by(Some("node"), None, SelectedHow::Exec)
        );
        assert_eq!(
            selected_by(&s, &exec),
            by(Some("node"), None, SelectedHow::Exec)
        );

        // One found running that never locked, gone: out of the kernel's map within a
        // full reading's period.
        let idle = p.collector.spawn_process(PID + 5, "node");
        p.collector.select(&idle, How::Set, 1);
        p.poll(false).unwrap();
        p.collector.vanish(&idle);
        for _ in 0..super::super::FULL_READ_EVERY {
            p.poll(false).unwrap();
        }
        assert!(!p.collector.selection().iter().any(|s| s.pid == PID + 5));

        // Without a named selection (the agent, a system-wide run), nothing is said.
        let mut p = Profile::new(FakeKernel::new(false), true);
        let t = p.collector.spawn_process(PID, "node");
        p.collector.take(&t, cause::MMAP, 1);
        p.collector.select(&t, How::Exec, 1);
        p.poll(false).unwrap();
        assert_eq!(selected_by(&p.summary(), &t), None);
    }
}
