//! Unit tests of the stack attribution.
use super::labels::frame_label;
use super::retire::{Progress, RETIRE_AFTER, RETIRE_AT_MOST};
use super::*;
use crate::registry::perfmap::JitName;
use bytemuck::Zeroable;
use std::path::PathBuf;

fn f(symbol: Option<&str>, dso: Option<&str>) -> Frame {
    Frame {
        addr: 0x1000,
        symbol: symbol.map(String::from),
        dso: dso.map(PathBuf::from),
        build_id: None,
        jit: None,
        v8: None,
    }
}

#[test]
fn writes_are_charged_past_the_c_runtime() {
    let libc = Some("/usr/lib/x86_64-linux-gnu/libc.so.6");
    let frames = [
        f(Some("mmap64"), libc),
        f(Some("sysmalloc"), libc),
        f(
            Some("operator new"),
            Some("/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"),
        ),
        f(Some("churn"), Some("/tmp/a/build/Release/churn.node")),
        f(Some("node::Start"), Some("/usr/bin/node")),
    ];
    assert_eq!(charge(&frames), "/tmp/a/build/Release/churn.node");
    let jit = [
        f(Some("mprotect"), libc),
        f(None, None),
        f(None, Some("/usr/bin/node")),
    ];
    assert_eq!(charge(&jit), "[jit]");
    assert_eq!(charge(&[f(Some("mmap64"), libc)]), "[unknown]");
    assert_eq!(charge(&[]), "[unknown]");
}

#[test]
fn frames_read_naturally() {
    assert_eq!(
        frame_label(&f(Some("uv_fs_read"), Some("/usr/bin/node"))),
        "uv_fs_read (node)"
    );
    assert_eq!(frame_label(&f(None, None)), "[jit]");
    let js = Frame {
        jit: Some(JitName::parse("JS:*hotAllocator /srv/app.js:3:22")),
        ..f(None, None)
    };
    assert_eq!(frame_label(&js), "hotAllocator (/srv/app.js:3:22)");
    let builtin = Frame {
        jit: Some(JitName::parse("Builtin:ArrayPrototypePush")),
        ..f(None, None)
    };
    assert_eq!(frame_label(&builtin), "Builtin:ArrayPrototypePush");
    assert_eq!(
        frame_label(&f(None, Some("/lib/libz.so.1"))),
        "0x1000 (libz.so.1)"
    );
}

fn done(tid: u32, seq: u32, wait_ns: u64) -> SampleDone {
    SampleDone {
        tag: stack_record::DONE,
        tid,
        seq,
        _pad: 0,
        wait_ns,
        hold_ns: 100,
    }
}

fn pending(owner: ProcId, actor: ProcId, addr: u64) -> Pending {
    Pending {
        owner,
        actor,
        tid: 7,
        cause: profiler_common::cause::MMAP,
        frames: vec![RawFrame {
            addr,
            js: JsRef::None,
        }],
        dso: "[jit]".into(),
        end: StackEnd::Root,
        stops_in: "[anonymous]".into(),
        weight: 1,
    }
}

/// A sample the kernel side drew at one in 4 times `--stack-sample` (its process took more
/// than `--max-stack-rate` stacks a second) stands for 4 at the base rate: its count, wait
/// and hold count 4 times, in its code's totals and its stack's, and its holder's; one drawn
/// at the base rate (or by a kernel side that says nothing) counts once.
#[test]
fn a_sample_drawn_at_a_lower_rate_is_weighted_to_the_base_rate() {
    let mut a = StackAttribution::at_rate(64);
    // A pid above any pid_max: no such process, its frames the ip alone.
    let pid = 0x7fff_fff0;
    let p = ProcId::new(pid, 0);
    let mut h = StackHeader::zeroed();
    (h.tag, h.tid, h.owner, h.tgid, h.ip) = (stack_record::SAMPLE, 7, pid, pid, 0x1000);
    for (seq, every) in [(1, 256), (2, 64), (3, 0)] {
        (h.seq, h.every) = (seq, every);
        a.on_record(bytemuck::bytes_of(&h));
    }
    // The first one's holder, drawn with it (joined to the same outcome).
    let mut holder = h;
    (holder.tag, holder.tid, holder.waiter) = (stack_record::HOLDER, 8, 7);
    (holder.seq, holder.every) = (1, 256);
    a.on_record(bytemuck::bytes_of(&holder));
    for seq in 1..=3 {
        a.on_record(bytemuck::bytes_of(&done(7, seq, 10)));
    }
    a.flush();
    assert_eq!(a.dropped, 0);
    let o = a.owner(p).unwrap();
    let d = &o.dsos["[unknown]"];
    assert_eq!((d.count, d.wait.sum, d.hold.sum), (6, 60, 600));
    let raw: u64 = o.raw.values().map(|s| s.count).sum();
    assert_eq!(raw, 6);
    let holders: Vec<_> = o.holder_raw.values().collect();
    assert_eq!(holders.len(), 1);
    assert_eq!((holders[0].count, holders[0].wait_ns_sum), (4, 40));
}

#[test]
fn outcomes_join_their_stacks_and_fold() {
    let mut a = StackAttribution::default();
    let p = ProcId::new(5, 77);
    // A pending sample of a process that does not exist: no unwinder, the ip alone.
    a.pending.insert((7, 1), pending(p, p, 0x1234));
    a.unwinders.insert(p, None);
    a.on_done(&done(7, 1, 900));
    // An outcome whose sample is not there: a stack lost, not a sample waiting.
    a.on_done(&done(7, 2, 1));
    assert_eq!((a.unmatched, a.dropped), (0, 1));
    let o = a.owner(p).unwrap();
    assert_eq!(o.dsos["[jit]"].count, 1);
    assert_eq!(o.dsos["[jit]"].wait.sum, 900);
    assert!(a.owner(ProcId::new(5, 78)).is_none());
    a.symbolize();
    assert_eq!(a.folded(|_| "node".into()), "node-5;[jit] 1\n");
    // The ip alone, with no process to read: not known to be JIT code, so no hint to start
    // node with a perf map.
    assert_eq!(a.owner(p).unwrap().unnamed_jit, 0);
}

/// A stack that stops before its thread's first frame is kept by thread, reason and the file
/// it stops in; one that reaches it is not.
#[test]
fn cut_stacks_are_kept_by_thread_reason_and_file() {
    let mut a = StackAttribution::default();
    let p = ProcId::new(5, 77);
    a.unwinders.insert(p, None);
    for (seq, end, file) in [
        (1, StackEnd::NoUnwindInfo, "libvips-cpp.so.8"),
        (2, StackEnd::NoUnwindInfo, "libvips-cpp.so.8"),
        (3, StackEnd::UnreadableMemory, "libc.so.6"),
        (4, StackEnd::Root, "libc.so.6"),
    ] {
        let mut s = pending(p, p, 0x1000);
        (s.end, s.stops_in) = (end, file.into());
        a.pending.insert((7, seq), s);
        a.on_done(&done(7, seq, 10));
    }
    let cuts = &a.owner(p).unwrap().cuts;
    assert_eq!(cuts.len(), 2, "{cuts:?}");
    assert_eq!(
        cuts[&(7, StackEnd::NoUnwindInfo, "libvips-cpp.so.8".into())],
        2
    );
    assert_eq!(
        cuts[&(7, StackEnd::UnreadableMemory, "libc.so.6".into())],
        1
    );
}

/// The end of a run out of time: records read without being unwound are lost stacks, each
/// counted once (a discarded sample and its discarded outcome are one stack).
#[test]
fn discarded_records_are_lost_stacks_counted_once() {
    let mut a = StackAttribution::default();
    let p = ProcId::new(5, 77);
    // Unwound, waiting for its outcome, which is then discarded: one lost.
    a.pending.insert((7, 1), pending(p, p, 0x1000));
    a.discard(bytemuck::bytes_of(&done(7, 1, 10)));
    assert_eq!((a.dropped, a.pending_samples()), (1, 0));
    // A discarded sample, then its discarded outcome: one lost.
    let mut h = StackHeader::zeroed();
    (h.tag, h.tid, h.seq, h.owner, h.tgid) = (stack_record::SAMPLE, 7, 2, 5, 5);
    a.discard(bytemuck::bytes_of(&h));
    a.discard(bytemuck::bytes_of(&done(7, 2, 10)));
    assert_eq!(a.dropped, 2);
    // An outcome read normally whose sample went with its process: one lost.
    a.on_done(&done(7, 3, 10));
    assert_eq!(a.dropped, 3);
    assert!(a.owner(p).is_none());
    // A sample discarded by the end's first drain, its outcome read normally after the
    // kernel's last flush: one lost (it was two, a guest's summary had more stacks kept and
    // lost than writes).
    h.seq = 4;
    a.discard(bytemuck::bytes_of(&h));
    a.on_done(&done(7, 4, 10));
    assert_eq!(a.dropped, 4);
}

#[test]
fn a_reused_pid_is_another_owner_and_actor() {
    let mut a = StackAttribution::default();
    let (old, new) = (ProcId::new(5, 77), ProcId::new(5, 99));
    a.pending.insert((7, 1), pending(old, old, 0x1000));
    a.pending.insert((8, 1), pending(new, new, 0x2000));
    a.on_done(&done(7, 1, 10));
    a.on_done(&done(8, 1, 20));
    assert_eq!(a.owner(old).unwrap().dsos["[jit]"].wait.sum, 10);
    assert_eq!(a.owner(new).unwrap().dsos["[jit]"].wait.sum, 20);
    a.symbolize();
    let comm = |p: ProcId| if p == old { "old" } else { "new" }.to_string();
    // Without unwinders (no such processes) the frames are unknown code.
    assert_eq!(a.folded(comm), "old-5;[jit] 1\nnew-5;[jit] 1\n");
}

#[test]
fn actor_is_the_owner_with_its_start_or_a_foreign_pid() {
    let mut s = StackHeader::zeroed();
    // Kernel start times are in ns, ProcIds' in clock ticks.
    (s.owner, s.tgid, s.owner_start) = (5, 5, 77_000_000_000);
    assert_eq!(actor(&s), ProcId::new(5, ids::ticks_of_ns(77_000_000_000)));
    assert_eq!(owner(&s), actor(&s));
    s.tgid = 6;
    assert_eq!(actor(&s), ProcId::new(6, 0));
}

#[test]
fn forgetting_a_process_symbolizes_then_drops_its_unwinder_and_samples() {
    let mut a = StackAttribution::default();
    let (p, q) = (ProcId::new(5, 77), ProcId::new(9, 3));
    let foreign = ProcId::new(5, 0);
    a.unwinders.insert(p, None);
    a.unwinders.insert(q, None);
    a.unwinders.insert(foreign, None);
    // Done: a stack of p on its own lock, and one of p on q's.
    a.pending.insert((7, 1), pending(p, p, 0x1000));
    a.pending.insert((7, 2), pending(q, foreign, 0x1000));
    a.on_done(&done(7, 1, 10));
    a.on_done(&done(7, 2, 10));
    // Waiting: one of p, one of q.
    a.pending.insert((7, 3), pending(p, p, 0x1000));
    a.pending.insert((9, 1), pending(q, q, 0x2000));
    assert_eq!((a.cached_processes(), a.pending_samples()), (3, 2));

    a.forget_now(p);
    assert_eq!((a.cached_processes(), a.pending_samples()), (1, 1));
    assert_eq!(a.unmatched, 1);
    // Its stacks were named before the unwinder went, wherever they were charged.
    for owner in [p, q] {
        let o = a.owner(owner).unwrap();
        assert!(o.raw.is_empty());
        assert_eq!(o.stacks()[&vec!["[jit]".to_string()]].count, 1);
    }
    // q's thread 9 exits with its sample still waiting.
    a.forget_thread_now(9);
    assert_eq!((a.pending_samples(), a.unmatched), (0, 2));
    // Its outcome, read after: that stack is lost.
    a.on_done(&done(9, 1, 10));
    assert_eq!(a.dropped, 1);
    a.forget_now(q);
    assert_eq!(a.cached_processes(), 0);
}

#[test]
fn unwinders_are_per_process_and_never_of_a_reused_pid() {
    use crate::registry::roles::tests::{me, my_predecessor};
    let mut a = StackAttribution::default();
    a.prepare(me());
    assert!(a.unwinders[&me()].is_some());
    // The process that had our pid before us must not get our maps, and leaves nothing
    // behind; nor does a process that does not exist.
    a.prepare(my_predecessor());
    a.prepare(ProcId::new(u32::MAX - 1, 0));
    assert_eq!(a.cached_processes(), 1);
    a.forget_now(my_predecessor());
    assert_eq!(a.cached_processes(), 1);
    a.forget_now(me());
    assert_eq!(a.cached_processes(), 0);
}

#[test]
fn the_application_function_is_past_nodes_library_and_v8s_builtins() {
    use super::symbolize::innermost_application;
    let js = |name: &str, location: &str| JsFunction {
        name: name.into(),
        location: location.into(),
    };
    let builtin = js("Uint8Array", "");
    let lib = js("alloc", "node:buffer:440:30");
    let app = js("neverOptimized", "/srv/app.js:77:24");
    assert_eq!(
        innermost_application(&[&builtin, &lib, &app]),
        Some(&app),
        "a built-in function is not the application's"
    );
    assert_eq!(innermost_application(&[&lib, &builtin]), Some(&lib));
    assert_eq!(innermost_application(&[]), None);
}

/// Each sampled acquisition keeps its thread, its cause, its wait and its hold: the samples of
/// a profile; the report's stacks merge them.
#[test]
fn samples_keep_their_thread_cause_and_hold() {
    use profiler_common::cause;
    let mut a = StackAttribution::default();
    let p = ProcId::new(5, 77);
    a.unwinders.insert(p, None);
    let sample = |tid, c| Pending {
        tid,
        cause: c,
        ..pending(p, p, 0x1000)
    };
    a.pending.insert((7, 1), sample(7, cause::MMAP));
    a.pending.insert((7, 2), sample(7, cause::MMAP));
    a.pending.insert((8, 1), sample(8, cause::MPROTECT));
    a.on_done(&done(7, 1, 10));
    a.on_done(&done(7, 2, 20));
    a.on_done(&done(8, 1, 5));
    a.symbolize();
    let o = a.owner(p).unwrap();
    let key = |tid, c| SampleKey {
        tid,
        cause: c,
        frames: vec![0],
    };
    let agg = |count, wait_ns_sum, hold_ns_sum| StackAgg {
        count,
        wait_ns_sum,
        hold_ns_sum,
    };
    assert_eq!(o.samples[&key(7, cause::MMAP)], agg(2, 30, 200));
    assert_eq!(o.samples[&key(8, cause::MPROTECT)], agg(1, 5, 100));
    assert_eq!(o.frames.get(0).label(), "[jit]");
    assert_eq!(o.stacks()[&vec!["[jit]".to_string()]], agg(3, 35, 300));
}

/// A process gone keeps its unwinder while records made before its exit may still wait in
/// the backlog: a late sample of it is unwound as the others, its reads are handed over once
/// (not counted again while it retires), and it goes once the records copied `RETIRE_AFTER`
/// after it went have all been unwound, however long that takes (a run loop far behind, as
/// on an emulated host), or after `RETIRE_AT_MOST` in any case.
#[test]
fn a_process_gone_keeps_its_unwinder_until_its_records_are_unwound() {
    use crate::registry::roles::tests::me;
    let at = |copied: Option<u64>, unwound: u64| Progress { copied, unwound };
    let mut a = StackAttribution::default();
    a.prepare(me());
    a.forget_process(me());
    assert_eq!(a.cached_processes(), 1, "kept while it retires");
    assert!(a.reads(me()).is_empty(), "its reads were handed over");
    let t0 = std::time::Instant::now();
    a.retire_due_at(at(Some(10), 10), t0);
    assert_eq!(
        a.cached_processes(),
        1,
        "just gone: its records may be on the way"
    );
    // By then 500 records were copied, of which 40 unwound: the last of them are its.
    a.retire_due_at(at(Some(500), 40), t0 + RETIRE_AFTER);
    assert_eq!(a.cached_processes(), 1, "the backlog not unwound yet");
    // Long after, with more copied since (a later process's), still short of the mark.
    a.retire_due_at(at(Some(9_000), 499), t0 + RETIRE_AT_MOST / 2);
    assert_eq!(a.cached_processes(), 1, "far behind, still kept");
    a.retire_due_at(at(Some(9_000), 500), t0 + RETIRE_AT_MOST / 2);
    assert_eq!(a.cached_processes(), 0, "its records unwound");
    // The copier's backlog full when it would mark (records in the kernel's ring): the mark
    // waits for a look that copied all there was.
    a.prepare(me());
    a.forget_process(me());
    a.retire_due_at(at(None, 700), t0 + RETIRE_AFTER);
    a.retire_due_at(at(Some(800), 800), t0 + RETIRE_AFTER);
    assert_eq!(a.cached_processes(), 1, "marked at 800 only now");
    a.retire_due_at(at(Some(800), 800), t0 + RETIRE_AFTER * 2);
    assert_eq!(a.cached_processes(), 0);
    // Never unwound past it: gone all the same, later.
    a.prepare(me());
    a.forget_process(me());
    a.retire_due_at(at(None, 0), t0 + RETIRE_AT_MOST);
    assert_eq!(a.cached_processes(), 1);
    a.retire_due_at(at(None, 0), std::time::Instant::now() + RETIRE_AT_MOST);
    assert_eq!(a.cached_processes(), 0);
}

/// A thread gone keeps its samples while their outcomes may still wait in the backlog: an
/// outcome that comes after the thread was seen to exit still finds its sample (it used to be
/// a lost stack); past the grace, a sample still waiting is dropped as before.
#[test]
fn a_thread_gone_keeps_its_samples_until_the_backlog_is_unwound() {
    let mut a = StackAttribution::default();
    let p = ProcId::new(5, 77);
    a.unwinders.insert(p, None);
    a.pending.insert((7, 1), pending(p, p, 0x1000));
    a.pending.insert((7, 2), pending(p, p, 0x1000));
    a.forget_thread(7);
    // Its first sample's outcome, unwound after the poll that saw it exit.
    a.on_done(&done(7, 1, 10));
    assert_eq!((a.dropped, a.unmatched, a.pending_samples()), (0, 0, 1));
    let t0 = std::time::Instant::now();
    let at = |copied: u64, unwound: u64| Progress {
        copied: Some(copied),
        unwound,
    };
    a.retire_due_at(at(20, 5), t0 + RETIRE_AFTER);
    assert_eq!(a.pending_samples(), 1, "the backlog not unwound yet");
    a.retire_due_at(at(30, 20), t0 + RETIRE_AFTER);
    assert_eq!((a.pending_samples(), a.unmatched), (0, 1));
}
