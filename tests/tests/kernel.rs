//! ROOT-ONLY: what the kernel offers, probed (`mmaplock-prof --probe-kernel`), decides what
//! every mode does. Where a feature every mode needs is missing (Linux 5.10 in the kernel
//! matrix), each mode exits at once with status 1 and one line naming what is missing, the
//! probes' own verdict; elsewhere a profile starts and ends normally, and `--blockers` runs
//! exactly where `bpf_loop` is there.

use std::{
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{KernelFeatures, kernel_features, profiler_bin};

/// Runs the profiler with `args` (each ends by itself: refused, or after `-d`); its output
/// and how long it took.
fn run(args: &[&str]) -> (Output, Duration) {
    let t0 = Instant::now();
    let out = Command::new(profiler_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run mmaplock-prof");
    (out, t0.elapsed())
}

#[test]
fn the_probes_decide_every_mode() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test loads eBPF programs: run as root"
    );
    let f = kernel_features();
    let verdict = f.verdict();
    for line in f.text.lines() {
        assert!(
            line.contains(": "),
            "a probe line is `name: value`: {line:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let study_out = dir.path().join("study");
    let modes: [&[&str]; 4] = [
        &["-d", "1", "-i", "0"],
        &["agent", "--listen", "127.0.0.1:0", "--comm", "mlp-none"],
        &["demo", "-n", "10"],
        &["study", "--quick", "--out", study_out.to_str().unwrap()],
    ];
    if let Some(refusal) = verdict.strip_prefix("this kernel") {
        // Refused: the probes' exit status says so, and every mode says the same one line.
        assert_eq!(f.status, 1, "{}", f.text);
        let line = format!("mmaplock-prof: this kernel{refusal}");
        for args in modes {
            let (out, took) = run(args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert_eq!(
                err.trim_end(),
                line,
                "{args:?}: one line naming what is missing"
            );
            assert!(out.stdout.is_empty(), "{args:?}");
            // At once: refused before anything is loaded. A load and attach takes over 10 s
            // in an emulated guest and a refusal under 1 s, so the bound, scaled with the
            // speed factor, tells them apart on any machine.
            let bound = integration_tests::scaled(Duration::from_secs(5));
            assert!(took < bound, "{args:?} took {took:?} (bound {bound:?})");
        }
        return;
    }
    assert_eq!(f.status, 0, "{}", f.text);
    assert!(verdict.starts_with("every mode runs"), "{verdict}");
    // The kernel's registers and thread pointer, as this build's architecture has them: the
    // whole diagnosis (causes, stacks, roles by start routine) on x86_64 and arm64 alike.
    let arch = if cfg!(target_arch = "aarch64") {
        "arm64"
    } else {
        "x86_64"
    };
    assert_eq!(f.architecture(), arch, "{}", f.text);
    assert!(
        f.value("mmap_lock tracepoints").unwrap().starts_with("yes"),
        "{}",
        f.text
    );
    assert_preemptible_probe_as_the_sources_say(f);
    // A profile starts and ends with its summary; with --blockers where the kernel has
    // bpf_loop, else --blockers alone is refused in its own line, exit 1 (one attach each
    // way: an attach takes 15 s in the kernel matrix's emulated guests).
    if f.bpf_loop() {
        assert_eq!(verdict, "every mode runs");
        let (out, _) = run(&["--blockers", "-d", "1", "-i", "0"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"type\":\"summary\""));
    } else {
        let (out, _) = run(&["--blockers", "-d", "1", "-i", "0"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains("--blockers needs bpf_loop"), "{err}");
        let (out, _) = run(modes[0]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"type\":\"summary\""));
    }
}

/// The preemptible-tracepoints probe against the kernels' sources: up to 6.18 every
/// tracepoint callback runs with preemption off (6.1 and 6.12 have a `tracepoint_srcu`, for
/// their rcuidle tracepoints only, which a probe could mistake for it); 7.3 calls them under
/// SRCU-fast, preemptible. Releases between are not checked, nor realtime kernels.
fn assert_preemptible_probe_as_the_sources_say(f: &KernelFeatures) {
    let said = f
        .value("preemptible tracepoint programs (second copies)")
        .unwrap_or_else(|| panic!("no preemptible probe:\n{}", f.text));
    let realtime = std::fs::read_to_string("/sys/kernel/realtime").is_ok_and(|s| s.trim() == "1");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(['.', '-', '+']);
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0)
    };
    let version = (next(), next());
    if realtime {
        return;
    }
    if version <= (6, 18) {
        assert_eq!(said, "no", "Linux {release}: {}", f.text);
    } else if version >= (7, 3) {
        assert_eq!(said, "yes", "Linux {release}: {}", f.text);
    }
}
