//! Where and how the agent pushes: `--pyroscope`, `--otlp`, `--push-interval`,
//! `--push-header`, `--push-ca`, from the command line and from `--config` lines of the same
//! names (`pyroscope URL`, `otlp URL`, `push-interval SECS`, `push-header NAME: VALUE`,
//! `push-ca FILE`), each value checked as on the command line. The command line wins for a
//! setting given in both; headers add up. Read once, at start (SIGHUP re-reads the
//! selection only).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{agent::selection::SelectionError, cli};

/// The `--config` keywords of push settings (the selection's reader passes over them).
pub const KEYS: [&str; 5] = [
    "pyroscope",
    "otlp",
    "push-interval",
    "push-header",
    "push-ca",
];

/// The default `--push-interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PushSettings {
    /// Base URLs (no trailing `/`).
    pub pyroscope: Option<String>,
    pub otlp: Option<String>,
    /// None: [`DEFAULT_INTERVAL`].
    pub interval: Option<Duration>,
    pub headers: Vec<(String, String)>,
    pub ca: Option<PathBuf>,
}

impl PushSettings {
    /// Whether anything is pushed.
    pub fn any(&self) -> bool {
        self.pyroscope.is_some() || self.otlp.is_some()
    }

    /// Whether sampled stacks are pushed (they must be taken).
    pub fn profiles(&self) -> bool {
        self.any()
    }

    pub fn interval(&self) -> Duration {
        self.interval.unwrap_or(DEFAULT_INTERVAL)
    }

    /// Adds a `--config` file's push lines to what the command line left unset.
    pub fn add_file(&mut self, path: &Path, text: &str) -> Result<(), SelectionError> {
        let mut file = PushSettings::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            let Some((kind, value)) = line.split_once(char::is_whitespace) else {
                continue;
            };
            let value = value.trim();
            let bad = |what: String| SelectionError::Syntax {
                path: path.into(),
                line: i + 1,
                what: format!("{kind}: {what}"),
            };
            match kind {
                "pyroscope" => file.pyroscope = Some(cli::parse_push_url(value).map_err(bad)?),
                "otlp" => file.otlp = Some(cli::parse_push_url(value).map_err(bad)?),
                "push-interval" => {
                    file.interval = Some(cli::parse_push_interval(value).map_err(bad)?)
                }
                "push-header" => file
                    .headers
                    .push(cli::parse_push_header(value).map_err(bad)?),
                "push-ca" if value.is_empty() => return Err(bad("a path cannot be empty".into())),
                "push-ca" => file.ca = Some(PathBuf::from(value)),
                _ => {}
            }
        }
        self.pyroscope = self.pyroscope.take().or(file.pyroscope);
        self.otlp = self.otlp.take().or(file.otlp);
        self.interval = self.interval.or(file.interval);
        self.ca = self.ca.take().or(file.ca);
        self.headers.extend(file.headers);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_wins_and_headers_add_up() {
        let mut s = PushSettings {
            otlp: Some("http://a:4318".into()),
            headers: vec![("X-A".into(), "1".into())],
            ..PushSettings::default()
        };
        let text = "comm node\notlp http://b:4318\npyroscope https://p:4040/ # there\n\
                    push-interval 30\npush-header Authorization: Bearer t0k\npush-ca /etc/ca.pem\n";
        s.add_file(Path::new("/etc/sel"), text).unwrap();
        assert_eq!(s.otlp.as_deref(), Some("http://a:4318"));
        assert_eq!(s.pyroscope.as_deref(), Some("https://p:4040"));
        assert_eq!(s.interval(), Duration::from_secs(30));
        assert_eq!(s.headers.len(), 2);
        assert_eq!(s.ca.as_deref(), Some(Path::new("/etc/ca.pem")));
    }

    #[test]
    fn a_bad_line_names_the_file_and_line_never_a_secret() {
        let mut s = PushSettings::default();
        let e = s
            .add_file(
                Path::new("/etc/sel"),
                "comm node\npush-header Bearer s3cret\n",
            )
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/etc/sel:2: push-header:"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        let e = s
            .add_file(Path::new("/etc/sel"), "otlp localhost:4318\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/etc/sel:1: otlp:"), "{e}");
    }
}
