//! The kernel's selection of profiled processes, as the agent, `--comm` and `--children`
//! change it: the selected processes (`SELECTED`, pid -> start time and how each came in)
//! and the selectors matched at every exec, fork and rename.

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use profiler_common::{
    CgroupSelector, ExeSelector, MAX_CGROUP_SELECTORS, MAX_EXE_SELECTORS, SELECTED_BY_RULE,
    SelectorCounts, how, selected_how, selected_selector, selected_ticks, selected_value,
};

use super::{
    collector::{Collector, CollectorError, error_chain, map_of},
    selectors::KernelSelectors,
};

/// A process userspace puts in the kernel's selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    pub pid: u32,
    /// Its start time, in clock ticks.
    pub ticks: u64,
    /// Selected by a rule (a name, an executable, a cgroup) rather than by its pid: its
    /// forks are selected too, and an exec into what no rule matches deselects it.
    pub by_rule: bool,
    /// The selector that matched: its number + 1 (0: none), as the kernel numbers them
    /// (command names, then executables, then cgroups: [`KernelSelectors`]).
    pub selector: u8,
}

impl Pick {
    /// A process selected by its pid.
    pub fn pid(pid: u32, ticks: u64) -> Self {
        Pick {
            pid,
            ticks,
            by_rule: false,
            selector: 0,
        }
    }

    /// A process selected by a rule: selector `selector` (its number + 1; 0: unsaid).
    pub fn rule(pid: u32, ticks: u64, selector: u8) -> Self {
        Pick {
            by_rule: true,
            selector,
            ..Pick::pid(pid, ticks)
        }
    }
}

/// How a process came into the kernel's selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Userspace put it there ([`Pick`]): a pid, or a process found running.
    Set,
    /// Its exec matched a selector.
    Exec,
    /// It renamed itself to a selected name.
    Rename,
    /// A selected process forked it.
    Fork,
}

/// A process in the kernel's selection, as the kernel holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selected {
    pub pid: u32,
    pub ticks: u64,
    pub by_rule: bool,
    pub how: How,
    /// The selector that matched, + 1 (0: none), as in [`Pick::selector`].
    pub selector: u8,
}

impl Selected {
    /// A `SELECTED` entry, decoded.
    pub fn of(pid: u32, value: u64) -> Self {
        Selected {
            pid,
            ticks: selected_ticks(value),
            by_rule: value & SELECTED_BY_RULE != 0,
            how: match selected_how(value) {
                how::EXEC => How::Exec,
                how::RENAME => How::Rename,
                how::FORK => How::Fork,
                _ => How::Set,
            },
            selector: selected_selector(value) as u8,
        }
    }
}

impl Collector {
    /// Sets the selected processes (the agent, `--comm`, `--children`): those in `add` are
    /// profiled from now on, those in `remove` (pid, start ticks) no more. Threads drop
    /// their cached verdicts.
    pub fn update_selection(
        &mut self,
        add: &[Pick],
        remove: &[(u32, u64)],
    ) -> Result<(), CollectorError> {
        if add.is_empty() && remove.is_empty() {
            return Ok(());
        }
        for &(pid, ticks) in remove {
            self.deselect(pid, ticks);
        }
        for p in add {
            let value = selected_value(p.ticks, p.by_rule, how::SET, p.selector.into());
            self.selected
                .insert(p.pid, value, 0)
                .map_err(|e| CollectorError::Map("SELECTED", error_chain(&e)))?;
        }
        self.generation = self.generation.wrapping_add(1);
        if !add.is_empty() && self.mode == crate::vocab::Mode::Contention {
            // The next reading runs the iterator, which notes the new processes' locks.
            for (map, name) in [
                (&mut self.activity, "ACTIVITY"),
                (&mut self.note_locks, "NOTE_LOCKS"),
            ] {
                map.set(0, 1, 0)
                    .map_err(|e| CollectorError::Map(name, error_chain(&e)))?;
            }
        }
        self.selection_gen
            .set(0, self.generation, 0)
            .map_err(|e| CollectorError::Map("SELECTION_GEN", error_chain(&e)))
    }

    /// Drops process (`pid`, `ticks`) from the kernel's selection, if it is there under its
    /// own start time: the kernel may have selected a new process under the same pid since
    /// (at its exec, fork or rename), which stays.
    pub fn deselect(&mut self, pid: u32, ticks: u64) {
        if let Ok(v) = self.selected.get(&pid, 0)
            && selected_ticks(v) == ticks
        {
            let _ = self.selected.remove(&pid);
        }
    }

    /// The processes in the kernel's selection now (pid, start ticks): with `--children`, the
    /// targets and the descendants the kernel added at fork; for the agent, also those the
    /// kernel selected by its selectors at exec and fork.
    pub fn selected(&self) -> Vec<(u32, u64)> {
        self.selection().iter().map(|s| (s.pid, s.ticks)).collect()
    }

    /// [`selected`](Self::selected), with how each process came in.
    pub fn selection(&self) -> Vec<Selected> {
        self.selected
            .iter()
            .filter_map(Result::ok)
            .map(|(pid, v)| Selected::of(pid, v))
            .collect()
    }

    /// Gives the kernel the selectors (the agent's, `--comm`'s), matched at every exec, fork
    /// and rename from now on (a process they select is profiled from its first
    /// instruction). The counts go last, so that a half-written list is never matched.
    pub fn set_selectors(&mut self, s: &KernelSelectors) -> Result<(), CollectorError> {
        let map_err =
            |name| move |e: aya::maps::MapError| CollectorError::Map(name, error_chain(&e));
        let mut counts: Array<&mut MapData, SelectorCounts> = map_of(&mut self.ebpf, "SEL_COUNTS")?;
        counts
            .set(0, SelectorCounts::default(), 0)
            .map_err(map_err("SEL_COUNTS"))?;
        let mut exes: Array<&mut MapData, ExeSelector> = map_of(&mut self.ebpf, "SEL_EXES")?;
        for (i, e) in s.exes.iter().take(MAX_EXE_SELECTORS as usize).enumerate() {
            exes.set(i as u32, *e, 0).map_err(map_err("SEL_EXES"))?;
        }
        let mut cgroups: Array<&mut MapData, CgroupSelector> =
            map_of(&mut self.ebpf, "SEL_CGROUPS")?;
        for (i, c) in s
            .cgroups
            .iter()
            .take(MAX_CGROUP_SELECTORS as usize)
            .enumerate()
        {
            cgroups
                .set(i as u32, *c, 0)
                .map_err(map_err("SEL_CGROUPS"))?;
        }
        let mut comms: BpfHashMap<&mut MapData, [u64; 2], u8> =
            map_of(&mut self.ebpf, "SEL_COMMS")?;
        let old: Vec<[u64; 2]> = comms.keys().filter_map(Result::ok).collect();
        for k in old {
            let _ = comms.remove(&k);
        }
        // Each with its number + 1, which the kernel notes with the processes it selects.
        for (i, c) in s.comms.iter().enumerate() {
            comms
                .insert(bytemuck::cast::<_, [u64; 2]>(*c), i as u8 + 1, 0)
                .map_err(map_err("SEL_COMMS"))?;
        }
        let mut counts: Array<&mut MapData, SelectorCounts> = map_of(&mut self.ebpf, "SEL_COUNTS")?;
        counts
            .set(
                0,
                SelectorCounts {
                    exes: s.exes.len().min(MAX_EXE_SELECTORS as usize) as u32,
                    cgroups: s.cgroups.len().min(MAX_CGROUP_SELECTORS as usize) as u32,
                    comms: s.comms.len() as u32,
                    _pad: 0,
                },
                0,
            )
            .map_err(map_err("SEL_COUNTS"))
    }
}
