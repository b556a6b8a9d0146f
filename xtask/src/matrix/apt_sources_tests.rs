use std::path::Path;

use super::*;

const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// This machine kind's /etc/apt/sources.list.d/debian.sources (a Debian image's), with a
/// third party's stanza and a disabled mirror beside it.
const DEB822: &str = "\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.example/archive/debian-security/20250520T000000Z
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: https://deb.nodesource.example/node_20.x
Suites: nodistro
Components: main
Architectures: amd64
Signed-By: /usr/share/keyrings/nodesource.gpg

Enabled: no
Types: deb deb-src
URIs: http://old-mirror.example/debian
Suites: trixie
Components: main contrib
";

#[test]
fn deb822_stanzas_are_read_and_disabled_ones_dropped() {
    let e = parse_deb822(DEB822);
    assert_eq!(e.len(), 3, "{e:#?}");
    assert_eq!(e[0].types, ["deb"]);
    assert_eq!(e[0].uris, ["http://mirror.example/debian"]);
    assert_eq!(e[0].suites, ["bookworm", "bookworm-updates"]);
    assert_eq!(e[0].components, ["main"]);
    assert_eq!(e[0].signed_by.as_deref(), Some(KEYRING));
    assert_eq!(e[2].suites, ["nodistro"]);
    // Only the archive itself: not its security archive, not the third party's.
    assert_eq!(
        debian_archives(&e),
        [Archive {
            uris: vec!["http://mirror.example/debian".into()],
            signed_by: Some(KEYRING.into()),
        }]
    );
}

#[test]
fn deb822_fields_are_case_insensitive_and_may_list_several_uris() {
    let text = "types: deb\nuris: http://a.example/debian\n  http://b.example/debian\nsuites: trixie\n\ttrixie-backports\ncomponents: main non-free-firmware\nenabled: yes\n";
    let e = parse_deb822(text);
    assert_eq!(
        e[0].uris,
        ["http://a.example/debian", "http://b.example/debian"]
    );
    assert_eq!(e[0].suites, ["trixie", "trixie-backports"]);
    assert_eq!(debian_archives(&e)[0].uris.len(), 2);
}

/// A key written in the stanza, over several lines (` .` an empty one), kept whole.
#[test]
fn an_embedded_key_is_kept_and_written_back() {
    let text = "Types: deb\nURIs: file:/srv/mirror/debian\nSuites: stable\nComponents: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mDMEZ\n -----END PGP PUBLIC KEY BLOCK-----\n";
    let e = parse_deb822(text);
    let key = e[0].signed_by.as_deref().unwrap();
    assert_eq!(
        key,
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ\n-----END PGP PUBLIC KEY BLOCK-----"
    );
    let a = debian_archives(&e);
    let written = private_sources(&a, &["bookworm"], Some(Path::new(KEYRING)));
    assert!(
        written.ends_with("Signed-By: -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mDMEZ\n -----END PGP PUBLIC KEY BLOCK-----\n"),
        "{written}"
    );
    // Read back, the same key.
    assert_eq!(parse_deb822(&written)[0].signed_by.as_deref(), Some(key));
}

#[test]
fn one_line_entries_with_options_and_comments() {
    let text = "\
# deb http://commented.example/debian bookworm main
deb [arch=amd64 signed-by=/etc/apt/keyrings/site.gpg] http://mirror.example/debian bookworm main contrib # site mirror
deb-src http://mirror.example/debian bookworm main
deb [ signed-by=/usr/share/keyrings/debian-archive-bookworm-stable.gpg,/usr/share/keyrings/debian-archive-bookworm-automatic.gpg ] http://other.example/debian bookworm-backports main
deb http://security.example/debian-security bookworm-security main
deb https://packages.cloud.example/apt cloud-sdk-bookworm main
deb http://archive.ubuntu.example/ubuntu jammy main
deb [trusted=yes] http://flat.example/repo ./

";
    let e = parse_one_line(text);
    assert_eq!(e.len(), 7, "{e:#?}");
    assert_eq!(e[0].uris, ["http://mirror.example/debian"]);
    assert_eq!(e[0].components, ["main", "contrib"]);
    assert_eq!(
        e[0].signed_by.as_deref(),
        Some("/etc/apt/keyrings/site.gpg")
    );
    assert_eq!(e[1].types, ["deb-src"]);
    let a = debian_archives(&e);
    assert_eq!(a.len(), 2, "{a:#?}");
    assert_eq!(a[0].uris, ["http://mirror.example/debian"]);
    assert_eq!(a[1].uris, ["http://other.example/debian"]);
}

#[test]
fn a_configuration_without_debian_names_no_archive() {
    let ubuntu = "deb http://archive.ubuntu.example/ubuntu noble main universe\n";
    assert!(debian_archives(&parse_one_line(ubuntu)).is_empty());
    let contrib_only =
        "Types: deb\nURIs: http://m.example/debian\nSuites: trixie\nComponents: contrib\n";
    assert!(debian_archives(&parse_deb822(contrib_only)).is_empty());
    let src_only = "deb-src http://m.example/debian trixie main\n";
    assert!(debian_archives(&parse_one_line(src_only)).is_empty());
}

/// Debian's keys (none named, or one release's keyring) become Debian's whole keyring, which
/// signs every suite the matrix takes; a site's own keys are kept.
#[test]
fn the_keys_cover_the_other_suites() {
    let full = Some(Path::new(KEYRING));
    assert_eq!(keys_for(None, full).as_deref(), Some(KEYRING));
    assert_eq!(keys_for(None, None), None);
    let one_release = "/usr/share/keyrings/debian-archive-bookworm-stable.gpg";
    assert_eq!(keys_for(Some(one_release), full).as_deref(), Some(KEYRING));
    assert_eq!(
        keys_for(Some(one_release), None).as_deref(),
        Some(one_release)
    );
    for own in [
        "/etc/apt/keyrings/site.gpg",
        "/usr/share/keyrings/debian-archive-keyring.gpg,0123456789ABCDEF0123456789ABCDEF01234567",
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ\n-----END PGP PUBLIC KEY BLOCK-----",
    ] {
        assert_eq!(keys_for(Some(own), full).as_deref(), Some(own));
    }
}

#[test]
fn the_private_list_has_every_suite_of_each_archive_in_main() {
    let archives = debian_archives(&parse_deb822(DEB822));
    let s = private_sources(
        &archives,
        &["bullseye", "bookworm", "trixie", "trixie-backports"],
        Some(Path::new(KEYRING)),
    );
    assert_eq!(
        s,
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bullseye bookworm trixie trixie-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    );
    let back = parse_deb822(&s);
    assert_eq!(back[0].suites.len(), 4);
}
