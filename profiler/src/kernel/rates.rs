//! Each process's sampling rate as the kernel side has raised it (`--max-stack-rate`): what
//! the agent's interval lines say a hot process was sampled at.

use std::collections::HashMap;

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::SampleRate;

use super::collector::Collector;

impl Collector {
    /// The one-in-N each process whose rate the kernel side raised past `--stack-sample` is
    /// sampled at now, by tgid (none without a bound on stacks a second, or when the map
    /// cannot be read: the rates then go unsaid, the counts are weighted all the same).
    pub fn raised_rates(&self) -> HashMap<u32, u32> {
        let base = self.stack_sample;
        let Some(map) = self.ebpf.map("SAMPLE_RATE") else {
            return HashMap::new();
        };
        let Ok(rates) = BpfHashMap::<&MapData, u32, SampleRate>::try_from(map) else {
            return HashMap::new();
        };
        (rates.iter().filter_map(Result::ok))
            .filter(|(_, r)| base > 0 && r.every > base)
            .map(|(tgid, r)| (tgid, r.every))
            .collect()
    }
}
