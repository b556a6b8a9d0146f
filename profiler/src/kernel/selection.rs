//! The kernel's selection of profiled processes, as the agent and `--children` change it:
//! the selected processes (`SELECTED`, pid -> start time) and the selectors matched at every
//! exec and fork.

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
use profiler_common::{
    CgroupSelector, ExeSelector, MAX_CGROUP_SELECTORS, MAX_EXE_SELECTORS, SELECTED_BY_RULE,
    SelectorCounts,
};

use super::{
    collector::{Collector, CollectorError, error_chain, map_of},
    selectors::KernelSelectors,
};

impl Collector {
    /// Sets the selected processes (the agent, `--children`): those in `add` (pid, start
    /// ticks, selected by a rule rather than by pid) are profiled from now on, those in
    /// `remove` no more. Threads drop their cached verdicts.
    pub fn update_selection(
        &mut self,
        add: &[(u32, u64, bool)],
        remove: &[(u32, u64)],
    ) -> Result<(), CollectorError> {
        if add.is_empty() && remove.is_empty() {
            return Ok(());
        }
        for &(pid, ticks) in remove {
            self.deselect(pid, ticks);
        }
        for &(pid, ticks, by_rule) in add {
            let value = if by_rule {
                ticks | SELECTED_BY_RULE
            } else {
                ticks
            };
            self.selected
                .insert(pid, value, 0)
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
            && v & !SELECTED_BY_RULE == ticks
        {
            let _ = self.selected.remove(&pid);
        }
    }

    /// The processes in the kernel's selection now (pid, start ticks): with `--children`, the
    /// targets and the descendants the kernel added at fork; for the agent, also those the
    /// kernel selected by its selectors at exec and fork.
    pub fn selected(&self) -> Vec<(u32, u64)> {
        self.selected
            .iter()
            .filter_map(Result::ok)
            .map(|(pid, v)| (pid, v & !SELECTED_BY_RULE))
            .collect()
    }

    /// Gives the kernel the agent's selectors, matched at every exec and fork from now on (a
    /// process they select is profiled from its first instruction). The counts go last, so
    /// that a half-written list is never matched.
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
        for c in &s.comms {
            comms
                .insert(bytemuck::cast::<_, [u64; 2]>(*c), 1, 0)
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
