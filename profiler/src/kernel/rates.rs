//! Each process's sampling rate as the kernel side has raised it (`--max-stack-rate`): what
//! the agent's interval lines say a hot process was sampled at.

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::SampleRate;

use super::collector::Collector;

impl Collector {
    /// The one-in-N process `tgid` is sampled at now, when the kernel side raised it past
    /// `--stack-sample` (None without a bound on stacks a second, below it, or when the map
    /// cannot be read: the rate then goes unsaid, the counts are weighted all the same). One
    /// lookup per process reported, not a walk of the map (its entries outlive processes).
    pub fn raised_rate(&self, tgid: u32) -> Option<u32> {
        let map = self.ebpf.map("SAMPLE_RATE")?;
        let rates = BpfHashMap::<&MapData, u32, SampleRate>::try_from(map).ok()?;
        let r = rates.get(&tgid, 0).ok()?;
        (self.stack_sample > 0 && r.every > self.stack_sample).then_some(r.every)
    }
}
