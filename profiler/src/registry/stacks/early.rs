//! A process's V8 frame layout given to the kernel side as soon as the process is seen, when
//! its executable is a node binary whose layout is already known (read by another process's
//! unwinder): its first samples then carry copies of their frames' objects. Otherwise its
//! layout comes with its unwinder, which is made at its first sample's batch, and the objects
//! of that first burst are read from the process instead (each read takes its `mmap_lock`).
//! In a pool of short processes (Vitest's forks pool: a node process per test file) that
//! first burst was most of what was read of each.

use std::os::unix::fs::MetadataExt as _;

use super::{StackAttribution, still_there};
use crate::vocab::ids::ProcId;

/// The (device, inode) of a process's executable, as `/proc/PID/maps` writes them (the key
/// of layouts: `v8::SharedLayouts`). Reading the link takes no lock of the process's.
fn exe_key(pid: u32) -> Option<(String, u64)> {
    let m = std::fs::metadata(format!("/proc/{pid}/exe")).ok()?;
    let dev = m.dev();
    let name = crate::registry::procmaps::dev_name(libc::major(dev), libc::minor(dev));
    Some((name, m.ino()))
}

impl StackAttribution {
    /// Gives process `p` (a new process, or one that exec'd) its V8 frame layout now if its
    /// executable's is known ([`take_v8_frames`](Self::take_v8_frames)). Looked at once per
    /// image, and only before its unwinder is made (which gives it otherwise).
    pub fn early_v8_frames(&mut self, p: ProcId) {
        if self.unwinders.contains_key(&p) || self.early_v8.contains_key(&p) {
            return;
        }
        let frames = exe_key(p.pid)
            .and_then(|key| self.shared.v8.known(&key))
            .and_then(|layout| layout.frames())
            // The pid is still that process's (read after the link).
            .filter(|_| still_there(p));
        self.early_v8.insert(p, frames.is_some());
        if let Some(frames) = frames {
            log::debug!("V8 layout of {p:?} given at first sight");
            self.v8_frames.push((p.pid, Some(frames)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::v8::metadata::{Layout, tests::node20};

    fn me() -> ProcId {
        ProcId::of_live(std::process::id()).expect("this process")
    }

    /// A process whose executable is a binary of known layout is given it at once, once per
    /// image; it is unset when the process is forgotten, and given again after an exec.
    #[test]
    fn a_process_of_a_known_node_is_given_its_layout_at_once() {
        let layout = Layout::from_symbols(&node20(), "node").unwrap();
        let frames = layout.frames().expect("node 20's frames");
        let mut a = StackAttribution::default();
        // Not known yet: nothing given, and not looked at again for this image.
        a.early_v8_frames(me());
        assert!(a.take_v8_frames().is_empty());
        a.shared.v8.learn(exe_key(me().pid).unwrap(), layout);
        a.early_v8_frames(me());
        assert!(a.take_v8_frames().is_empty());
        // An exec: the new image is looked at.
        a.forget_image(me());
        assert_eq!(a.take_v8_frames(), []);
        a.early_v8_frames(me());
        let given = a.take_v8_frames();
        assert_eq!(given.len(), 1);
        assert_eq!(given[0].0, me().pid);
        assert_eq!(
            bytemuck::bytes_of(&given[0].1.unwrap()),
            bytemuck::bytes_of(&frames)
        );
        a.early_v8_frames(me());
        assert!(a.take_v8_frames().is_empty(), "once per image");
        // Gone: its layout is unset for the kernel side.
        a.forget_image(me());
        assert_eq!(a.take_v8_frames(), [(me().pid, None)]);
    }

    /// A process of another executable gets none; nor does one whose pid another process
    /// has now (its start time is not the one seen), though that one's executable is known.
    #[test]
    fn a_process_gone_or_of_another_binary_is_given_none() {
        let mut a = StackAttribution::default();
        let layout = || Layout::from_symbols(&node20(), "node").unwrap();
        a.shared.v8.learn(("00:00".into(), 1), layout());
        a.early_v8_frames(me());
        assert!(a.take_v8_frames().is_empty());
        let mut b = StackAttribution::default();
        b.shared.v8.learn(exe_key(me().pid).unwrap(), layout());
        b.early_v8_frames(ProcId::new(me().pid, me().start + 1));
        assert!(b.take_v8_frames().is_empty());
    }

    /// A process gone whose pid a new process of a known node has taken meanwhile: the new
    /// one's layout is not unset when the old one is forgotten.
    #[test]
    fn a_reused_pid_keeps_the_new_processs_layout() {
        let mut a = StackAttribution::default();
        a.shared.v8.learn(
            exe_key(me().pid).unwrap(),
            Layout::from_symbols(&node20(), "node").unwrap(),
        );
        let old = ProcId::new(me().pid, me().start.saturating_sub(1));
        a.early_v8.insert(old, true);
        a.early_v8_frames(me());
        assert_eq!(a.take_v8_frames().len(), 1);
        a.forget_image(old);
        assert_eq!(a.take_v8_frames(), [], "the new process's layout stays");
    }
}
