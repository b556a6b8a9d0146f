//! The script a guest runs: its speed factor, the probes, then each test alone, its output
//! and status into the shared directory; before each step, the step's name and limit in
//! `current` for the host's watch (`super::watch`).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use super::watch::{KILL_AFTER_S, SPEED_ENV, STEP_BASE_S, TEST_BASE_S};

/// The script for `tests`, with `binaries` (test file -> executable) and the profiler and
/// helpers in `bin_dir`; `default_factor` is the speed factor its limits take when the guest
/// cannot measure its own, and `test_most_s` the longest a test's limit may be, however slow
/// the guest says it is. With `tarball` (as `cargo xtask dist` packs one), the guest unpacks
/// it and its binary probes the kernel too (`tarball.txt`, its status in `tarball.status`).
pub fn guest_script(
    rwdir: &Path,
    tests: &[(&str, &str)],
    binaries: &[(String, PathBuf)],
    bin_dir: &Path,
    tarball: Option<&Path>,
    default_factor: f64,
    test_most_s: u64,
) -> Result<String> {
    let root = crate::workspace_root();
    let rw = rwdir.display();
    let mut s = format!(
        "#!/bin/sh\n# Written by cargo xtask's kernel matrix; run inside the guest.\n\
         cd {tests_dir} || exit 1\n\
         export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/busybox RUST_BACKTRACE=0\n\
         export MMAPLOCK_PROF_TEST_SKIP_FILE={rw}/skips.txt MMAPLOCK_PROF_TEST_GUEST=1\n",
        tests_dir = root.join("tests").display(),
    );
    if crate::suite::under_ci() {
        s.push_str("export CI=true\n");
    }
    // bpftrace's tracepoint probes (the contention tests' independent count) need tracefs.
    s.push_str("mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null\n");
    let speed = bin_dir.join("speed-factor");
    let speed = speed.display();
    s.push_str(&format!(
        "uname -r > {rw}/release.txt\n\
         # The step that begins and its limit in seconds: the host names it if the guest hangs.\n\
         step() {{ printf '%s\\t%s\\n' \"$1\" \"$2\" > {rw}/current; }}\n\
         # $1 seconds of the reference machine at this guest's speed factor.\n\
         lim() {{ awk -v b=\"$1\" -v f=\"$f\" 'BEGIN {{ if (f < 1) f = 1; printf \"%d\\n\", b * f + 0.5 }}'; }}\n\
         # The guest's own speed factor, for the tests and the limits: the host's is not the guest's.\n\
         f={default_factor}\n\
         unset {SPEED_ENV}\n\
         if [ -x {speed} ]; then\n\
         \x20 step speed-factor $(lim {STEP_BASE_S})\n\
         \x20 m=$(timeout -k {KILL_AFTER_S} $(lim {STEP_BASE_S}) {speed} 2> {rw}/logs/speed-factor.log)\n\
         \x20 case \"$m\" in\n\
         \x20   ''|*[!0-9.]*|*.*.*) echo \"printed '$m': the limits take $f\" >> {rw}/logs/speed-factor.log ;;\n\
         \x20   *) f=$m; export {SPEED_ENV}=$m; echo \"$m\" > {rw}/speed.txt ;;\n\
         \x20 esac\n\
         fi\n\
         step probe-kernel $(lim {STEP_BASE_S})\n\
         timeout -k {KILL_AFTER_S} $(lim {STEP_BASE_S}) {profiler} --probe-kernel > {rw}/probe.txt 2>&1\n\
         t() {{ l=$(lim {TEST_BASE_S}); [ \"$l\" -gt {test_most_s} ] && l={test_most_s}; step \"$1\" \"$l\"; s=$(date +%s); \
         timeout -k {KILL_AFTER_S} \"$l\" \"$2\" --exact \"$3\" --test-threads=1 --show-output > {rw}/logs/$1.log 2>&1; \
         printf '%s\\t%s\\t%s\\n' \"$1\" $? $(( $(date +%s) - s )) >> {rw}/results.tsv; }}\n",
        profiler = bin_dir.join("mmaplock-prof").display(),
    ));
    if let Some(t) = tarball {
        // Unpacked where the guest may write, as a host installs it: the binary alone.
        s.push_str(&format!(
            "step tarball $(lim {STEP_BASE_S})\n\
             mkdir -p {rw}/tarball && tar -xzf {t} -C {rw}/tarball && \
             timeout -k {KILL_AFTER_S} $(lim {STEP_BASE_S}) {rw}/tarball/*/bin/mmaplock-prof --probe-kernel > {rw}/tarball.txt 2>&1; \
             echo $? > {rw}/tarball.status\n",
            t = t.display(),
        ));
    }
    for (file, test) in tests {
        let bin = binaries
            .iter()
            .find(|(f, _)| f == file)
            .map(|(_, b)| b)
            .with_context(|| format!("no test binary {file} (tests/tests/{file}.rs)"))?;
        s.push_str(&format!("t {file}::{test} {} {test}\n", bin.display()));
    }
    s.push_str(&format!(
        "step power-off $(lim {STEP_BASE_S})\necho done > {rw}/done\n"
    ));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn the_script_runs_each_test_alone_with_its_binary() {
        let bins = vec![
            ("kernel".to_string(), PathBuf::from("/t/kernel-1")),
            ("profiler".to_string(), PathBuf::from("/t/profiler-2")),
        ];
        let tests = [("kernel", "a"), ("profiler", "b")];
        let s = guest_script(
            Path::new("/rw"),
            &tests,
            &bins,
            Path::new("/b"),
            None,
            40.0,
            900,
        )
        .unwrap();
        assert!(!s.contains("tarball"), "{s}");
        let packed = Path::new("/d/mmaplock-prof-1-aarch64-linux.tar.gz");
        let t = guest_script(
            Path::new("/rw"),
            &tests,
            &bins,
            Path::new("/b"),
            Some(packed),
            40.0,
            900,
        )
        .unwrap();
        assert!(
            t.contains("tar -xzf /d/mmaplock-prof-1-aarch64-linux.tar.gz -C /rw/tarball")
                && t.contains("/rw/tarball/*/bin/mmaplock-prof --probe-kernel > /rw/tarball.txt"),
            "{t}"
        );
        assert!(s.contains("t kernel::a /t/kernel-1 a\n"), "{s}");
        assert!(s.contains("t profiler::b /t/profiler-2 b\n"), "{s}");
        assert!(
            s.contains("/b/mmaplock-prof --probe-kernel > /rw/probe.txt"),
            "{s}"
        );
        assert!(s.contains("f=40\n"), "{s}");
        assert!(
            guest_script(
                Path::new("/rw"),
                &[("jsnames", "x")],
                &bins,
                Path::new("/b"),
                None,
                40.0,
                900
            )
            .is_err()
        );
    }

    /// The script's own shell code, run here in a scratch directory with stand-ins for the
    /// speed measurement (printing `speed`, or none when None), the profiler and a test: the
    /// factor the script takes, the limit the test's step has, and what the test saw.
    fn run_script(speed: Option<&str>) -> (String, Option<String>, String) {
        let dir = std::env::temp_dir().join(format!(
            "xtask-script-{}-{}",
            std::process::id(),
            speed.unwrap_or("none")
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let d = dir.display();
        let test = dir.join("test-bin");
        let ran = format!("echo \"$2 ${SPEED_ENV}\" >> {d}/ran\ncat {d}/current >> {d}/ran\n");
        std::fs::write(&test, format!("#!/bin/sh\n{ran}")).unwrap();
        let fake_speed = dir.join("speed-factor");
        if let Some(f) = speed {
            std::fs::write(&fake_speed, format!("#!/bin/sh\necho {f}\necho why >&2\n")).unwrap();
        }
        for f in [&test, &fake_speed] {
            let _ = Command::new("chmod").arg("+x").arg(f).status();
        }
        let bins = vec![("kernel".to_string(), test.clone())];
        let bin_dir = Path::new("/nonexistent-bin");
        let script = guest_script(&dir, &[("kernel", "a")], &bins, bin_dir, None, 40.0, 900)
            .unwrap()
            .replace(
                &bin_dir.join("speed-factor").display().to_string(),
                &fake_speed.display().to_string(),
            )
            .replace(&bin_dir.join("mmaplock-prof").display().to_string(), "true")
            .replace("mount -t tracefs", "true");
        // The host's factor, which the guest's replaces (or drops, when it has none).
        let out = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .env(SPEED_ENV, "1.3")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        assert!(read("results.tsv").unwrap().starts_with("kernel::a\t0\t"));
        assert_eq!(read("done").as_deref(), Some("done\n"));
        let got = (
            read("ran").unwrap(),
            read("speed.txt"),
            read("current").unwrap(),
        );
        std::fs::remove_dir_all(&dir).unwrap();
        got
    }

    #[test]
    fn the_guest_measures_its_speed_and_scales_its_limits() {
        // 60 s × 2.5 for the test, 20 s × 2.5 for the power-off.
        let (ran, speed, last) = run_script(Some("2.5"));
        assert_eq!(ran, "a 2.5\nkernel::a\t150\n");
        assert_eq!(speed.as_deref(), Some("2.5\n"));
        assert_eq!(last, "power-off\t50\n");
    }

    /// No `speed-factor` (or one that printed no number): the tests measure for themselves,
    /// and the limits take the default factor (60 s × 40), up to the longest a test's may be.
    #[test]
    fn without_a_factor_the_limits_take_the_default() {
        for speed in [None, Some("fast")] {
            let (ran, written, last) = run_script(speed);
            assert_eq!(ran, "a \nkernel::a\t900\n", "{speed:?}");
            assert_eq!(written, None);
            assert_eq!(last, "power-off\t800\n");
        }
    }
}
