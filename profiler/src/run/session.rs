//! A profiling session from attach to the final drain: the collector (inside the profile),
//! its ring buffers and the profile. The one-shot profile, the agent and the Node workload
//! runner (demo, study) each configure their collector, then hand it to a [`Session`], so that
//! opening the rings and the end of a run (drain, last flush and reading, drain again) are
//! written once.

use std::time::Duration;

use crate::{
    kernel::collector::Collector,
    run::{Driver, LoopConfig, Profile, Rings, SessionError, copier::look_every, lost, run_loop},
};

/// The collector, its rings and the profile, owned together until the run is over.
pub struct Session {
    /// What was gathered; it stays readable after [`finish`](Self::finish), whatever failed.
    pub profile: Profile,
    rings: Rings,
    /// Who set the run's options: what its `lost` advice may name.
    pub advice: lost::Advice,
}

impl Session {
    /// Takes an attached and configured collector: opens its ring buffers (inside the async
    /// runtime) and prepares sampled stacks for `stack_pids` (empty: whatever is selected).
    /// `interval`: how often interval reports will be asked for, if they will.
    pub fn new(
        mut collector: Collector,
        interval: Option<Duration>,
        stack_pids: &[u32],
    ) -> Result<Self, SessionError> {
        let rings = Rings::open(&mut collector, look_every(interval))?;
        let mut profile = Profile::new(collector, interval.is_some());
        profile.prepare_stacks(stack_pids);
        Ok(Session {
            profile,
            rings,
            advice: lost::Advice::default(),
        })
    }

    /// The shared run loop ([`run_loop`]) over this session: a failure while running comes
    /// back inside `Ok(Err(..))`, and the caller still calls [`finish`](Self::finish).
    pub async fn run(
        &mut self,
        cfg: LoopConfig<'_>,
        driver: &mut dyn Driver,
    ) -> Result<Result<(), SessionError>, SessionError> {
        run_loop(&mut self.profile, &mut self.rings, cfg, self.advice, driver).await
    }

    /// The end of the run: the records still in the rings, the kernel's last flush and
    /// reading ([`Profile::finish`]), the records that flush brought (threads first seen, the
    /// last sampled stacks), and a last word on anything lost. Everything gathered stays in
    /// [`profile`](Self::profile), even when the last reading fails.
    pub async fn finish(&mut self) -> Result<(), SessionError> {
        self.rings.drain_all(&mut self.profile);
        let last = self.profile.finish().await;
        self.rings.drain_all(&mut self.profile);
        if let Some(s) = &self.profile.stacks {
            log::debug!(
                "sampled stacks: {} lost in userspace, {} without an outcome at the end",
                s.dropped,
                s.unmatched + s.pending_samples() as u64
            );
        }
        lost::check(&self.profile.lost_so_far(), self.advice);
        last
    }
}
