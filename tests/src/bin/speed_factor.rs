//! Prints the suite's speed factor (tests/src/speed.rs): how much slower than the reference
//! machine this host or guest is now. `cargo xtask test` and the kernel matrix's guests run it
//! once at their start and pass the number on to every test in `MMAPLOCK_PROF_TEST_SPEED`.

fn main() {
    let f = integration_tests::speed::measure();
    eprintln!(
        "speed factor {f:.2}: the probe (short processes, mmap churn, computing on every core) \
         against the reference machine's {} ms",
        integration_tests::speed::REFERENCE_MS
    );
    println!("{f:.2}");
}
