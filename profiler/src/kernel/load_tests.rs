use super::*;

#[test]
fn filter_packs_pids_and_comms() {
    let f = filter_for(&CollectorConfig {
        pids: vec![7, 9],
        comms: vec!["node".into()],
        max_threads: 1,
        ..Default::default()
    })
    .unwrap();
    assert_eq!((f.n_pids, f.n_comms), (2, 1));
    assert_eq!(f.use_selection, 0);
    assert_eq!(&f.pids[..3], &[7, 9, 0]);
    assert_eq!(&f.comms[0][..5], b"node\0");
}

#[test]
fn filter_rejects_what_the_kernel_cannot_hold() {
    let long = CollectorConfig {
        comms: vec!["a-very-long-command-name".into()],
        ..Default::default()
    };
    assert!(matches!(
        filter_for(&long),
        Err(CollectorError::CommTooLong(_))
    ));
    let many = CollectorConfig {
        pids: (1..=(MAX_FILTER_PIDS as u32 + 1)).collect(),
        ..Default::default()
    };
    assert!(matches!(
        filter_for(&many),
        Err(CollectorError::TooManyPids)
    ));
}

/// The stand-in BTF gives aya the kernel's ids for the functions it looks up.
#[test]
fn stand_in_btf_has_the_functions_under_the_given_ids() {
    use aya_obj::btf::BtfKind;
    let id = |btf: &Btf, name: &str| btf.id_by_type_name_kind(name, BtfKind::Func).ok();
    for n in [1, 2, 7, 91_234] {
        let btf = btf_with_funcs(&[("bpf_iter_task", n)]);
        assert_eq!(id(&btf, "bpf_iter_task"), Some(n));
    }
    // In any order; an absent one (id 0) is left out.
    let btf = btf_with_funcs(&[("b", 76_016), ("a", 60_365), ("c", 0)]);
    assert_eq!(id(&btf, "a"), Some(60_365));
    assert_eq!(id(&btf, "b"), Some(76_016));
    assert_eq!(id(&btf, "c"), None);
}
