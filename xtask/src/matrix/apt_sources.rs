//! The Debian archive the machine's own apt configuration names (deb822 `.sources` files,
//! or one-line `sources.list` and `.list` files): the kernel matrix fetches its kernels from
//! there, as apt does the machine's packages. Sites use their own mirrors, and an air-gapped
//! host has nothing else, so no archive host is written anywhere in xtask.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// One entry of a sources file (a deb822 stanza, or a one-line `deb` line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `deb`, `deb-src`.
    pub types: Vec<String>,
    pub uris: Vec<String>,
    pub suites: Vec<String>,
    pub components: Vec<String>,
    /// As written: keyring paths and fingerprints (separated by commas or white space), or
    /// an embedded key block (its lines joined with `\n`).
    pub signed_by: Option<String>,
}

/// A Debian archive to fetch from: its URIs (mirrors of one another) and the keys that sign it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Archive {
    pub uris: Vec<String>,
    pub signed_by: Option<String>,
}

/// Debian's release names and their aliases: a suite that is one of them (with `-updates`,
/// `-backports` and the like) is Debian's. Ubuntu's, Devuan's and third parties' suites
/// (`nodistro`, `cloud-sdk-bookworm`) are not; `-security` suites are another archive, which
/// the matrix does not need.
const DEBIAN_RELEASES: &[&str] = &[
    "buzz",
    "rex",
    "bo",
    "hamm",
    "slink",
    "potato",
    "woody",
    "sarge",
    "etch",
    "lenny",
    "squeeze",
    "wheezy",
    "jessie",
    "stretch",
    "buster",
    "bullseye",
    "bookworm",
    "trixie",
    "forky",
    "duke",
    "sid",
    "oldoldstable",
    "oldstable",
    "stable",
    "testing",
    "unstable",
    "experimental",
];

/// The suites of one release in Debian's main archive, beside the release itself.
const SUITE_SUFFIXES: &[&str] = &[
    "-updates",
    "-proposed-updates",
    "-backports",
    "-backports-sloppy",
];

/// Debian's own keyring of every current release's archive keys (package
/// `debian-archive-keyring`).
pub const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The entries of a one-line file: `deb [opt=value ...] URI SUITE [COMPONENT ...]`; `#` starts
/// a comment anywhere on a line.
pub fn parse_one_line(text: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let Some((kind, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        if kind != "deb" && kind != "deb-src" {
            continue;
        }
        let mut rest = rest.trim_start();
        let mut signed_by = None;
        if let Some(opts) = rest.strip_prefix('[') {
            let Some((opts, after)) = opts.split_once(']') else {
                continue;
            };
            for opt in opts.split_whitespace() {
                if let Some(v) = opt.strip_prefix("signed-by=") {
                    signed_by = Some(v.to_string());
                }
            }
            rest = after;
        }
        let mut words = rest.split_whitespace().map(str::to_string);
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        entries.push(Entry {
            types: vec![kind.to_string()],
            uris: vec![uri],
            suites: vec![suite],
            components: words.collect(),
            signed_by,
        });
    }
    entries
}

/// The enabled stanzas of a deb822 file. Field names are case-insensitive; a field goes on in
/// lines that start with white space (` .` is an empty line); `#` lines are comments.
pub fn parse_deb822(text: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut flush = |fields: &mut Vec<(String, String)>| {
        if let Some(e) = entry_of(fields) {
            entries.push(e);
        }
        fields.clear();
    };
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            flush(&mut fields);
        } else if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = fields.last_mut() {
                let more = line.trim();
                value.push('\n');
                value.push_str(if more == "." { "" } else { more });
            }
        } else if let Some((name, value)) = line.split_once(':') {
            fields.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    flush(&mut fields);
    entries
}

/// A stanza's entry, unless it is disabled (`Enabled: no`) or lacks a URI or a suite.
fn entry_of(fields: &[(String, String)]) -> Option<Entry> {
    let get = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.trim())
    };
    let words = |name: &str| -> Vec<String> {
        get(name)
            .map(|v| v.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    if get("enabled").is_some_and(|v| v.eq_ignore_ascii_case("no")) {
        return None;
    }
    let e = Entry {
        types: words("types"),
        uris: words("uris"),
        suites: words("suites"),
        components: words("components"),
        signed_by: get("signed-by").map(str::to_string),
    };
    (!e.uris.is_empty() && !e.suites.is_empty()).then_some(e)
}

/// Whether `suite` is one of Debian's main archive (not its security archive).
fn is_debian_suite(suite: &str) -> bool {
    let release = SUITE_SUFFIXES
        .iter()
        .find_map(|s| suite.strip_suffix(s))
        .unwrap_or(suite);
    DEBIAN_RELEASES.contains(&release)
}

/// The Debian archives among `entries`: binary entries of a Debian suite with its `main`
/// component, each (URIs, keys) once, in the configuration's order.
pub fn debian_archives(entries: &[Entry]) -> Vec<Archive> {
    let mut archives: Vec<Archive> = Vec::new();
    for e in entries {
        let debian = e.types.iter().any(|t| t == "deb")
            && e.components.iter().any(|c| c == "main")
            && e.suites.iter().any(|s| is_debian_suite(s));
        if !debian {
            continue;
        }
        let a = Archive {
            uris: e.uris.clone(),
            signed_by: e.signed_by.clone(),
        };
        if !archives.contains(&a) {
            archives.push(a);
        }
    }
    archives
}

/// The keys to check `suites` of an archive with. An archive signed with Debian's own keys
/// (none named: apt's trusted keys; or Debian's keyrings, perhaps one release's only) is
/// checked against Debian's whole keyring when the machine has it, which holds the keys of
/// every suite the matrix takes; any other keys (a site that signs its mirror itself, with
/// a keyring, fingerprints or a key written in the stanza) sign every suite of that mirror,
/// and are kept as they are.
pub fn keys_for(signed_by: Option<&str>, debian_keyring: Option<&Path>) -> Option<String> {
    let full = debian_keyring.map(|p| p.display().to_string());
    let Some(v) = signed_by else { return full };
    let debian_only = !v.contains("BEGIN PGP")
        && v.split([',', ' ', '\t', '\n'])
            .filter(|k| !k.is_empty())
            .all(|k| {
                Path::new(k)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("debian-archive-"))
            });
    if debian_only && full.is_some() {
        return full;
    }
    Some(v.to_string())
}

/// A deb822 sources file for `suites` of `archives` (their `main` component).
pub fn private_sources(
    archives: &[Archive],
    suites: &[&str],
    debian_keyring: Option<&Path>,
) -> String {
    let mut out = String::new();
    for a in archives {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!(
            "Types: deb\nURIs: {}\nSuites: {}\nComponents: main\n",
            a.uris.join(" "),
            suites.join(" ")
        ));
        if let Some(keys) = keys_for(a.signed_by.as_deref(), debian_keyring) {
            out.push_str("Signed-By:");
            for (i, line) in keys.lines().enumerate() {
                out.push_str(match (i, line.is_empty()) {
                    (0, _) => " ",
                    (_, true) => "\n .",
                    (_, false) => "\n ",
                });
                out.push_str(line);
            }
            out.push('\n');
        }
    }
    out
}

/// Where the machine's apt reads its sources (`apt-config`, so that `APT_CONFIG` and
/// `Dir::Etc` are honoured): the one-line list and the parts directory.
fn host_paths() -> (PathBuf, PathBuf) {
    let out = std::process::Command::new("apt-config")
        .args([
            "shell",
            "SL",
            "Dir::Etc::sourcelist/f",
            "SP",
            "Dir::Etc::sourceparts/d",
        ])
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let var = |name: &str, default: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .map(|v| PathBuf::from(v.trim_matches('\'')))
            .unwrap_or_else(|| PathBuf::from(default))
    };
    (
        var("SL", "/etc/apt/sources.list"),
        var("SP", "/etc/apt/sources.list.d"),
    )
}

/// The Debian archives the machine's apt configuration names, or a one-line error.
pub fn host_archives() -> Result<Vec<Archive>> {
    let (list, parts) = host_paths();
    let mut entries = parse_one_line(&std::fs::read_to_string(&list).unwrap_or_default());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&parts)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    for f in files {
        let text = || std::fs::read_to_string(&f).unwrap_or_default();
        match f.extension().and_then(|e| e.to_str()) {
            Some("list") => entries.extend(parse_one_line(&text())),
            Some("sources") => entries.extend(parse_deb822(&text())),
            // apt reads no other file there (`*.disabled`, `*.save`).
            _ => {}
        }
    }
    let archives = debian_archives(&entries);
    if archives.is_empty() {
        bail!(
            "the machine's apt configuration ({} and {}/*.list, *.sources) names no Debian archive (a `deb` entry of a Debian suite with its main component)",
            list.display(),
            parts.display().to_string().trim_end_matches('/')
        );
    }
    Ok(archives)
}

#[cfg(test)]
#[path = "apt_sources_tests.rs"]
mod tests;
