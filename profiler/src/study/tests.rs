use super::*;

fn cfg(quick: bool, ks: &[u32], sizes: &[f64], scenarios: &[&str]) -> StudyConfig {
    StudyConfig {
        out: "out".into(),
        quick,
        ks: ks.to_vec(),
        sizes: sizes.to_vec(),
        scenarios: scenarios.iter().map(|s| s.to_string()).collect(),
        node: "node".into(),
        iterations: None,
        repeat: 3,
    }
}

#[test]
fn the_matrix_is_the_issues_unless_told_otherwise() {
    assert_eq!(
        cfg(false, &[], &[], &[]).matrix(),
        (vec![0.125, 64.0, 1024.0], vec![1, 2, 4])
    );
    assert_eq!(cfg(true, &[], &[], &[]).matrix(), (vec![64.0], vec![4]));
    assert_eq!(cfg(true, &[8], &[], &[]).matrix(), (vec![64.0], vec![8]));
    assert_eq!(
        cfg(false, &[], &[1.0], &[]).matrix(),
        (vec![1.0], vec![1, 2, 4])
    );
}

#[test]
fn scenarios_are_filtered_in_the_studys_order_and_unknown_ids_are_usage_errors() {
    assert_eq!(cfg(false, &[], &[], &[]).scenarios().unwrap(), SCENARIOS);
    assert_eq!(
        cfg(false, &[], &[], &["dispose", "default"])
            .scenarios()
            .unwrap(),
        ["default", "dispose"]
    );
    let e = cfg(false, &[], &[], &["reuse", "pool"])
        .scenarios()
        .unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(
        e.to_string()
            .starts_with("unknown scenario \"pool\" (one of: default,")
    );
}

#[test]
fn runs_are_sized_to_a_fraction_of_a_second_whatever_the_file_size() {
    // About 5 us a read plus 0.32 us a KiB: 0.25 s with one thread.
    for (kib, want) in [(0.125, 40_000), (64.0, 9_800), (1024.0, 750)] {
        assert_eq!(iterations_for(kib), want, "{kib} KiB");
    }
    assert_eq!(iterations_for(65536.0), 100);
    for kib in [0.0625, 1.0, 16.0, 256.0, 4096.0] {
        let n = iterations_for(kib);
        let s = f64::from(n) * (5e-6 + 0.32e-6 * kib);
        assert!(
            n.is_multiple_of(50) && (0.1..=0.3).contains(&s),
            "{kib} KiB: {n} reads, {s} s"
        );
    }
}

#[test]
fn sizes_are_named_in_their_unit() {
    assert_eq!(size_name(0.125), "128 B");
    assert_eq!(size_name(64.0), "64 KiB");
    assert_eq!(size_name(1024.0), "1 MiB");
}
