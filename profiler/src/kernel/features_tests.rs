//! The decision on the probes of real kernels, as `mmaplock-prof --probe-kernel` printed them
//! inside the kernel matrix's guests (Debian's packages, `cargo xtask matrix`) and on this
//! machine kind, and the printed form read back. Their `PROCMAP_QUERY` and map-read lines
//! were added with those probes, after they were recorded (no decision on running rests on
//! them: 6.11+ has the query, 6.17+ reads maps without the lock, `lock_next_vma`).

use super::*;

/// Linux 6.18 (this machine kind).
const LINUX_6_18: &str = "kernel: Linux 6.18.44-fc-v669
btf: yes
mmap_lock tracepoints: yes (mm, write, success) [Linux 6.14+]
raw tracepoint programs: yes
ring buffer: yes
task storage: yes
bpf_get_current_task_btf: yes
bpf_task_pt_regs: yes
task iterator: yes
bpf_loop (--blockers): yes
contention tracepoints: yes
per-VMA locks (few page faults take mmap_lock): yes
preemptible tracepoint programs (second copies): no
PROCMAP_QUERY (a mapping looked up alone): yes
memory maps read without mmap_lock: yes
architecture (causes, stacks, roles by start routine): x86_64
verdict: every mode runs";

/// Debian's newest (trixie-backports): tracepoint programs run preemptible.
const LINUX_7_3: &str = "kernel: Linux 7.3.4+deb13-amd64
btf: yes
mmap_lock tracepoints: yes (mm, write, success) [Linux 6.14+]
raw tracepoint programs: yes
ring buffer: yes
task storage: yes
bpf_get_current_task_btf: yes
bpf_task_pt_regs: yes
task iterator: yes
bpf_loop (--blockers): yes
contention tracepoints: yes
per-VMA locks (few page faults take mmap_lock): yes
preemptible tracepoint programs (second copies): yes
PROCMAP_QUERY (a mapping looked up alone): yes
memory maps read without mmap_lock: yes
architecture (causes, stacks, roles by start routine): x86_64
verdict: every mode runs";

/// Debian 12's Linux 6.1: the old prototype, no per-VMA locks.
const LINUX_6_1: &str = "kernel: Linux 6.1.0-50-amd64
btf: yes
mmap_lock tracepoints: yes (mm, memcg_path, write, success) [Linux 5.8-6.13]
raw tracepoint programs: yes
ring buffer: yes
task storage: yes
bpf_get_current_task_btf: yes
bpf_task_pt_regs: yes
task iterator: yes
bpf_loop (--blockers): yes
contention tracepoints: yes
per-VMA locks (few page faults take mmap_lock): no
preemptible tracepoint programs (second copies): no
PROCMAP_QUERY (a mapping looked up alone): no
memory maps read without mmap_lock: no
architecture (causes, stacks, roles by start routine): x86_64
verdict: every mode runs";

/// Debian 13's Linux 6.12: per-VMA locks, still the old prototype.
const LINUX_6_12: &str = "kernel: Linux 6.12.117+deb13-amd64
btf: yes
mmap_lock tracepoints: yes (mm, memcg_path, write, success) [Linux 5.8-6.13]
raw tracepoint programs: yes
ring buffer: yes
task storage: yes
bpf_get_current_task_btf: yes
bpf_task_pt_regs: yes
task iterator: yes
bpf_loop (--blockers): yes
contention tracepoints: yes
per-VMA locks (few page faults take mmap_lock): yes
preemptible tracepoint programs (second copies): no
PROCMAP_QUERY (a mapping looked up alone): yes
memory maps read without mmap_lock: no
architecture (causes, stacks, roles by start routine): x86_64
verdict: every mode runs";

/// Debian 11's Linux 5.10: refused.
const LINUX_5_10: &str = "kernel: Linux 5.10.0-32-amd64
btf: yes
mmap_lock tracepoints: no
raw tracepoint programs: yes
ring buffer: yes
task storage: no
bpf_get_current_task_btf: no
bpf_task_pt_regs: no
task iterator: yes
bpf_loop (--blockers): no
contention tracepoints: no
per-VMA locks (few page faults take mmap_lock): no
preemptible tracepoint programs (second copies): no
PROCMAP_QUERY (a mapping looked up alone): no
memory maps read without mmap_lock: no
architecture (causes, stacks, roles by start routine): x86_64
verdict: this kernel (Linux 5.10.0-32-amd64) lacks what mmaplock-prof needs: the mmap_lock tracepoints (Linux 5.11+), task local storage from tracepoint programs (Linux 5.13+), bpf_get_current_task_btf (Linux 5.11+), bpf_task_pt_regs (Linux 5.15+)";

fn parsed(text: &str) -> Features {
    Features::parse(text).unwrap_or_else(|| panic!("unreadable probes:\n{text}"))
}

#[test]
fn the_printed_probes_read_back_the_same() {
    for text in [LINUX_7_3, LINUX_6_18, LINUX_6_12, LINUX_6_1, LINUX_5_10] {
        let f = parsed(text);
        assert_eq!(f.to_string(), text);
        assert_eq!(parsed(&f.to_string()), f);
    }
    // An arm64 kernel's line (the kernel matrix's arm64 guests), and one of neither.
    let arm = LINUX_6_12.replace(
        "roles by start routine): x86_64",
        "roles by start routine): arm64",
    );
    assert_eq!(parsed(&arm).registers, crate::kernel::regs::Arch::Aarch64);
    assert_eq!(parsed(&arm).to_string(), arm);
    let other = LINUX_6_12.replace(
        "roles by start routine): x86_64",
        "roles by start routine): unknown (causes other, no stacks, roles by name)",
    );
    assert_eq!(parsed(&other).registers, crate::kernel::regs::Arch::Other);
    assert_eq!(parsed(&other).to_string(), other);
    let unknown = LINUX_6_18.replace(
        "bpf_loop (--blockers): yes",
        "bpf_loop (--blockers): unknown (bpf_prog_load failed: Operation not permitted)",
    );
    assert_eq!(
        parsed(&unknown).bpf_loop,
        Probe::Unknown("bpf_prog_load failed: Operation not permitted".into())
    );
    assert!(Features::parse("kernel: Linux 6.1\nbtf: yes\n").is_none());
}

/// Only 7.x's tracepoints run our programs preemptible; a recording from before the probe
/// existed reads as not preemptible (those kernels are not).
#[test]
fn only_newer_kernels_run_tracepoint_programs_preemptible() {
    assert!(parsed(LINUX_7_3).preemptible_tracepoints);
    for text in [LINUX_6_18, LINUX_6_12, LINUX_6_1] {
        assert!(!parsed(text).preemptible_tracepoints);
        let old = text.replace("preemptible tracepoint programs (second copies): no\n", "");
        assert!(!parsed(&old).preemptible_tracepoints);
    }
    assert!(decide(&parsed(LINUX_7_3), Needs::default()).is_ok());
}

/// Whether the profiler looks a mapping up alone is read back; a recording from before the
/// probe existed says no (nothing is decided on it).
#[test]
fn the_maps_query_is_read_back() {
    assert!(parsed(LINUX_6_18).procmap_query);
    assert!(!parsed(LINUX_6_1).procmap_query);
    let old = LINUX_6_18.replace("PROCMAP_QUERY (a mapping looked up alone): yes\n", "");
    assert!(!parsed(&old).procmap_query);
}

#[test]
fn kernels_with_every_feature_run_every_mode() {
    for text in [LINUX_6_18, LINUX_6_12, LINUX_6_1] {
        let f = parsed(text);
        assert_eq!(
            decide(
                &f,
                Needs {
                    blockers: true,
                    ..Needs::default()
                }
            ),
            Ok(()),
            "{text}"
        );
    }
    assert_eq!(
        parsed(LINUX_6_1).mmap_lock_tracepoints,
        Tracepoints::Layout(TracepointLayout::WithMemcgPath)
    );
    assert!(!parsed(LINUX_6_1).per_vma_locks && parsed(LINUX_6_18).per_vma_locks);
}

/// Debian 11's 5.10 is refused by every mode, naming each missing feature in one line.
#[test]
fn linux_5_10_is_refused_naming_what_it_lacks() {
    let f = parsed(LINUX_5_10);
    assert_eq!(
        f.missing(),
        [
            Feature::MmapLockTracepoints,
            Feature::TaskStorage,
            Feature::CurrentTaskBtf,
            Feature::TaskPtRegs
        ]
    );
    for blockers in [false, true] {
        let e = decide(
            &f,
            Needs {
                blockers,
                ..Needs::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("this kernel (Linux 5.10.0-32-amd64) lacks"),
            "{e}"
        );
    }
}

/// RHEL 9 calls itself 5.14 and has the BPF of 6.12: its probes decide, not its number.
#[test]
fn an_old_version_with_new_bpf_is_accepted() {
    let rhel9 = LINUX_6_18.replace("6.18.44-fc-v669", "5.14.0-570.12.1.el9_6.x86_64");
    let f = parsed(&rhel9);
    assert_eq!(
        decide(
            &f,
            Needs {
                blockers: true,
                ..Needs::default()
            }
        ),
        Ok(())
    );
}

/// Without `bpf_loop` (5.15, 5.16) only `--blockers` is refused, in its own line.
#[test]
fn only_blockers_need_bpf_loop() {
    let text = LINUX_6_1
        .replace("6.1.0-50-amd64", "5.15.0-91-generic")
        .replace("bpf_loop (--blockers): yes", "bpf_loop (--blockers): no");
    let f = parsed(&text);
    assert_eq!(decide(&f, Needs::default()), Ok(()));
    let e = decide(
        &f,
        Needs {
            blockers: true,
            ..Needs::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "--blockers needs bpf_loop (Linux 5.17+), which this kernel (Linux 5.15.0-91-generic) lacks: leave --blockers out"
    );
    assert!(
        f.to_string()
            .ends_with("verdict: every mode runs but --blockers")
    );
}

/// Contention mode needs the lock contention tracepoints (5.19+): asked for on a kernel
/// without them, one line; the agent's default then falls back to full mode instead.
#[test]
fn contention_mode_needs_the_contention_tracepoints() {
    let text = LINUX_6_1
        .replace("6.1.0-50-amd64", "5.15.0-91-generic")
        .replace("contention tracepoints: yes", "contention tracepoints: no");
    let f = parsed(&text);
    assert!(!f.contention_tracepoints);
    assert_eq!(decide(&f, Needs::default()), Ok(()));
    let e = decide(
        &f,
        Needs {
            contention: true,
            ..Needs::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "--mode contention needs contention tracepoints (lock:contention_begin/end, Linux 5.19+), which this kernel (Linux 5.15.0-91-generic) lacks: use --mode full"
    );
    let contention = Needs {
        contention: true,
        ..Needs::default()
    };
    assert_eq!(decide(&parsed(LINUX_6_1), contention), Ok(()));
}

/// A probe that could not be made (no privilege) refuses nothing: loading says what is
/// wrong, as before.
#[test]
fn an_unknown_probe_is_given_the_benefit() {
    let text = LINUX_6_18
        .replace("bpf_task_pt_regs: yes", "bpf_task_pt_regs: unknown (EPERM)")
        .replace(
            "bpf_loop (--blockers): yes",
            "bpf_loop (--blockers): unknown (EPERM)",
        );
    assert_eq!(
        decide(
            &parsed(&text),
            Needs {
                blockers: true,
                ..Needs::default()
            }
        ),
        Ok(())
    );
}

#[test]
fn each_missing_feature_is_named_in_one_line() {
    let f = parsed(
        &LINUX_6_1
            .replace(
                "mmap_lock tracepoints: yes (mm, memcg_path, write, success) [Linux 5.8-6.13]",
                "mmap_lock tracepoints: no",
            )
            .replace("bpf_task_pt_regs: yes", "bpf_task_pt_regs: no"),
    );
    assert_eq!(
        f.missing(),
        [Feature::MmapLockTracepoints, Feature::TaskPtRegs]
    );
    let e = decide(&f, Needs::default()).unwrap_err().to_string();
    assert_eq!(
        e,
        "this kernel (Linux 6.1.0-50-amd64) lacks what mmaplock-prof needs: the mmap_lock tracepoints (Linux 5.11+), bpf_task_pt_regs (Linux 5.15+)"
    );
    assert!(!e.contains('\n'));
    // No BTF: the features read from it are not listed as missing on top of it.
    let f = parsed(
        &LINUX_6_1
            .replace("\nbtf: yes", "\nbtf: no")
            .replace("task iterator: yes", "task iterator: no"),
    );
    assert_eq!(f.missing(), [Feature::Btf]);
    let unrecognised = LINUX_6_18.replace(
        "yes (mm, write, success) [Linux 6.14+]",
        "unrecognised (5 arguments)",
    );
    assert_eq!(
        parsed(&unrecognised).missing(),
        [Feature::TracepointPrototype]
    );
}

/// This machine kind has everything (the probes ask the running kernel).
#[test]
fn this_machine_runs_every_mode() {
    let f = Features::running();
    assert!(f.btf && f.task_iterator && f.contention_tracepoints, "{f}");
    assert!(
        matches!(f.mmap_lock_tracepoints, Tracepoints::Layout(_)),
        "{f}"
    );
}
