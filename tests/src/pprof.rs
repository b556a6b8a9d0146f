//! pprof profiles read by Go's own `go tool pprof` (`cargo xtask test` installs Debian's
//! `golang-go` when no Go is found): its `-raw` listing parsed into sample types, samples
//! (values and labels), functions and comments.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

/// The `go` command: on PATH, else Go's own install, else Debian's.
pub fn go_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("go"));
    on_path
        .chain(["/usr/local/go/bin/go", "/usr/lib/go/bin/go"].map(PathBuf::from))
        .find(|p| p.is_file())
}

/// One sample of a profile: its values (in the order of the sample types) and labels.
#[derive(Debug, Clone)]
pub struct RawSample {
    pub values: Vec<i64>,
    pub labels: BTreeMap<String, String>,
    /// Location ids, innermost first.
    pub locations: Vec<u64>,
}

/// What `go tool pprof -raw` printed of a profile.
#[derive(Debug, Default)]
pub struct RawProfile {
    /// `type/unit`, as the header of the samples says them (`[dflt]` removed).
    pub sample_types: Vec<String>,
    pub default_type: String,
    pub period_type: String,
    pub period: i64,
    pub comments: Vec<String>,
    pub samples: Vec<RawSample>,
    /// Location id: its line as printed (`0x0 M=1 mmap :0:0 s=0`).
    pub locations: BTreeMap<u64, String>,
    /// Mapping lines as printed (`1: 0x0/0x0/0x0 /usr/bin/node BUILDID [FN]`).
    pub mappings: Vec<String>,
    pub text: String,
}

impl RawProfile {
    /// The sum of one sample type's values.
    pub fn total(&self, sample_type: &str) -> i64 {
        let i = (self.sample_types.iter())
            .position(|t| t.split('/').next() == Some(sample_type))
            .unwrap_or_else(|| panic!("no {sample_type} in {:?}", self.sample_types));
        self.samples.iter().map(|s| s.values[i]).sum()
    }

    /// Location lines naming this function.
    pub fn locations_of(&self, function: &str) -> Vec<&str> {
        (self.locations.values())
            .filter(|l| l.split_whitespace().any(|w| w == function))
            .map(String::as_str)
            .collect()
    }
}

/// `go tool pprof ARGS` (its own directory for what it saves; over https, `ca` the only
/// certificate it trusts: Go reads `SSL_CERT_FILE`, and `go tool pprof` has no `-tls_ca` of
/// its own); its standard output, or what it said on failure.
pub fn go_pprof(go: &Path, args: &[&str], ca: Option<&Path>) -> Result<String, String> {
    let tmp = tempfile::tempdir().expect("a directory");
    let mut cmd = Command::new(go);
    cmd.args(["tool", "pprof"])
        .args(args)
        .env("PPROF_TMPDIR", tmp.path());
    if let Some(ca) = ca {
        cmd.env("SSL_CERT_FILE", ca).env("SSL_CERT_DIR", tmp.path());
    }
    let out = cmd.output().expect("run go tool pprof");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "go tool pprof {args:?}: {:?}\n{}{stdout}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `go tool pprof -raw` of a file or URL (`ca`: see [`go_pprof`]), parsed.
pub fn raw_profile(go: &Path, ca: Option<&Path>, source: &str) -> Result<RawProfile, String> {
    let args = ["-raw", "-symbolize=none", source];
    Ok(parse_raw(&go_pprof(go, &args, ca)?))
}

/// `-top`'s "Total samples = N" of one sample type ("": the profile's default, no flag), in
/// nanoseconds for times.
pub fn top_total(go: &Path, sample_type: &str, file: &str) -> i64 {
    let index = format!("-sample_index={sample_type}");
    let mut args = vec!["-top", "-unit=ns", file];
    if !sample_type.is_empty() {
        args.insert(1, &index);
    }
    let text = go_pprof(go, &args, None).expect("go tool pprof -top");
    let line = (text.lines())
        .find_map(|l| l.split("Total samples = ").nth(1))
        .unwrap_or_else(|| panic!("no total in:\n{text}"));
    let n: String = line
        .trim()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    n.parse().unwrap_or_else(|_| panic!("total {line:?}"))
}

fn parse_raw(text: &str) -> RawProfile {
    let mut p = RawProfile {
        text: text.to_string(),
        ..RawProfile::default()
    };
    #[derive(PartialEq)]
    enum Section {
        Head,
        Samples,
        Locations,
        Mappings,
    }
    let mut section = Section::Head;
    let mut header_seen = false;
    for line in text.lines() {
        match line {
            "Samples:" => {
                section = Section::Samples;
                continue;
            }
            "Locations" => {
                section = Section::Locations;
                continue;
            }
            "Mappings" => {
                section = Section::Mappings;
                continue;
            }
            _ => {}
        }
        match section {
            Section::Head => {
                if let Some(c) = line.strip_prefix("Comment: ") {
                    p.comments.push(c.to_string());
                } else if let Some(t) = line.strip_prefix("PeriodType: ") {
                    p.period_type = t.replace(' ', "/");
                } else if let Some(n) = line.strip_prefix("Period: ") {
                    p.period = n.trim().parse().unwrap_or(0);
                }
            }
            Section::Samples if !header_seen => {
                header_seen = true;
                for t in line.split_whitespace() {
                    let plain = t.trim_end_matches("[dflt]");
                    if plain != t {
                        p.default_type = plain.to_string();
                    }
                    p.sample_types.push(plain.to_string());
                }
            }
            Section::Samples => {
                if let Some((values, locations)) = line.split_once(':')
                    && values.split_whitespace().all(|v| v.parse::<i64>().is_ok())
                    && !values.trim().is_empty()
                {
                    p.samples.push(RawSample {
                        values: values
                            .split_whitespace()
                            .map(|v| v.parse().unwrap())
                            .collect(),
                        labels: BTreeMap::new(),
                        locations: locations
                            .split_whitespace()
                            .filter_map(|l| l.parse().ok())
                            .collect(),
                    });
                } else if let Some(s) = p.samples.last_mut() {
                    // `key:[value] key:[value]`, values without spaces but for cgroups'.
                    let mut rest = line.trim();
                    while let Some((k, after)) = rest.split_once(":[") {
                        let Some((v, more)) = after.split_once(']') else {
                            break;
                        };
                        s.labels.insert(k.trim().to_string(), v.to_string());
                        rest = more;
                    }
                }
            }
            Section::Locations => {
                if let Some((id, what)) = line.trim().split_once(": ")
                    && let Ok(id) = id.parse()
                {
                    p.locations.insert(id, what.to_string());
                }
            }
            Section::Mappings => p.mappings.push(line.to_string()),
        }
    }
    p
}
