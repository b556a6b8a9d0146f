//! Debian's kernel packages, fetched with `apt-get download` through a private sources list
//! and package lists (the host's apt configuration is never read or changed), unpacked with
//! `dpkg -x` and kept in `~/.cache/mmaplock-prof/kernels/NAME` like the tests' Node versions.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::Kernel;

/// The suites the matrix takes kernels from (only Debian's own servers: a package registry).
const SOURCES: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie-backports main
";

/// A kernel ready to boot: its image, and the tree whose `lib/modules` virtme-ng uses.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub vmlinuz: PathBuf,
    /// `uname -r` of that kernel.
    pub release: String,
}

pub fn kernels_dir() -> PathBuf {
    crate::packages::cache_dir("kernels")
}

/// The kernel of `k.suite`, from the cache or fetched into it.
pub fn fetch(k: &Kernel) -> Result<Fetched> {
    let dir = kernels_dir().join(k.name);
    if let Some(f) = cached(&dir) {
        return Ok(f);
    }
    let apt = PrivateApt::new(&kernels_dir().join("apt"))?;
    apt.update()?;
    let version = apt.suite_version("linux-image-amd64", k.suite)?;
    // The meta package names the image; newer packaging splits it into image, binary and
    // modules packages, all of one version.
    let image = apt
        .depends("linux-image-amd64", &version)?
        .into_iter()
        .find(|d| d.starts_with("linux-image-"))
        .context("linux-image-amd64 depends on no linux-image-*")?;
    let mut packages = vec![image.clone()];
    packages.extend(
        apt.depends(&image, &version)?
            .into_iter()
            .filter(|d| d.starts_with("linux-binary-") || d.starts_with("linux-modules-")),
    );
    let debs = dir.join("debs");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&debs)?;
    eprintln!(
        "xtask: fetching Linux {version} from Debian {} ({})",
        k.suite,
        packages.join(", ")
    );
    let wanted: Vec<String> = packages.iter().map(|p| format!("{p}={version}")).collect();
    crate::run(
        apt.command("apt-get")
            .current_dir(&debs)
            .arg("download")
            .args(&wanted),
    )?;
    let root = dir.join("root");
    for deb in std::fs::read_dir(&debs)? {
        crate::run(Command::new("dpkg").arg("-x").arg(deb?.path()).arg(&root))?;
    }
    std::fs::remove_dir_all(&debs)?;
    let f =
        unpacked(&dir).context("the unpacked packages hold no /boot/vmlinuz-* with its modules")?;
    std::fs::write(dir.join("ready"), format!("{version}\n"))?;
    Ok(f)
}

/// The kernel in `dir`, if fetched whole before.
fn cached(dir: &Path) -> Option<Fetched> {
    dir.join("ready").exists().then(|| unpacked(dir)).flatten()
}

/// The kernel unpacked in `dir`: its image (`/boot/vmlinuz-RELEASE`, or
/// `/usr/lib/modules/RELEASE/vmlinuz` in the newer packaging), and its modules beside it.
fn unpacked(dir: &Path) -> Option<Fetched> {
    let root = dir.join("root");
    let in_boot = std::fs::read_dir(root.join("boot"))
        .into_iter()
        .flatten()
        .flatten()
        .find_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let release = name.strip_prefix("vmlinuz-")?.to_string();
            Some(Fetched {
                vmlinuz: e.path(),
                release,
            })
        });
    let in_modules = || {
        std::fs::read_dir(root.join("usr/lib/modules"))
            .into_iter()
            .flatten()
            .flatten()
            .find_map(|e| {
                let vmlinuz = e.path().join("vmlinuz");
                let release = e.file_name().into_string().ok()?;
                vmlinuz.exists().then_some(Fetched { vmlinuz, release })
            })
    };
    let f = in_boot.or_else(in_modules)?;
    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .any(|m| root.join(m).join(&f.release).join("kernel").exists());
    modules.then_some(f)
}

/// apt with lists, cache and sources of its own, under `dir`.
struct PrivateApt {
    options: Vec<String>,
}

impl PrivateApt {
    fn new(dir: &Path) -> Result<Self> {
        for d in ["lists/partial", "cache/archives/partial", "etc"] {
            std::fs::create_dir_all(dir.join(d))?;
        }
        let sources = dir.join("etc/sources.list");
        std::fs::write(&sources, SOURCES)?;
        let d = |p: &str| dir.join(p).display().to_string();
        Ok(PrivateApt {
            options: vec![
                format!("Dir::Etc::sourcelist={}", sources.display()),
                "Dir::Etc::sourceparts=-".into(),
                format!("Dir::State::Lists={}", d("lists")),
                format!("Dir::Cache={}", d("cache")),
                "Dir::State::status=/dev/null".into(),
                // Root downloads into our own directories, which _apt cannot enter.
                "APT::Sandbox::User=root".into(),
            ],
        })
    }

    fn command(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        for o in &self.options {
            c.arg("-o").arg(o);
        }
        c.env("DEBIAN_FRONTEND", "noninteractive");
        c
    }

    fn update(&self) -> Result<()> {
        crate::run(self.command("apt-get").args(["update", "-qq"]))
    }

    fn output(&self, tool: &str, args: &[&str]) -> Result<String> {
        let out = self.command(tool).args(args).output()?;
        if !out.status.success() {
            bail!(
                "{tool} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The version of `package` in `suite` itself (not its -security or -updates).
    fn suite_version(&self, package: &str, suite: &str) -> Result<String> {
        let madison = self.output("apt-cache", &["madison", package])?;
        madison_version(&madison, suite)
            .with_context(|| format!("Debian {suite} has no {package}:\n{madison}"))
    }

    /// The package names `package=version` depends on.
    fn depends(&self, package: &str, version: &str) -> Result<Vec<String>> {
        let show = self.output("apt-cache", &["show", &format!("{package}={version}")])?;
        Ok(depends_of(&show))
    }
}

/// `apt-cache madison` lines are `name | version | URL suite/main arch Packages`.
fn madison_version(madison: &str, suite: &str) -> Option<String> {
    madison.lines().find_map(|l| {
        let mut cols = l.split('|').map(str::trim);
        let (_, version, source) = (cols.next()?, cols.next()?, cols.next()?);
        source
            .split_whitespace()
            .nth(1)?
            .strip_prefix(suite)?
            .starts_with("/main")
            .then(|| version.to_string())
    })
}

/// The package names of a `Depends:` field (alternatives included, versions dropped).
fn depends_of(show: &str) -> Vec<String> {
    show.lines()
        .find_map(|l| l.strip_prefix("Depends: "))
        .map(|d| {
            d.split([',', '|'])
                .filter_map(|p| p.split_whitespace().next())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suites_own_version_is_taken() {
        let m = "linux-image-amd64 | 7.3.4-1~bpo13+1 | http://deb.debian.org/debian trixie-backports/main amd64 Packages
linux-image-amd64 | 6.12.118-1 | http://deb.debian.org/debian-security trixie-security/main amd64 Packages
linux-image-amd64 | 6.12.117-1 | http://deb.debian.org/debian trixie/main amd64 Packages
linux-image-amd64 |  6.1.176-1 | http://deb.debian.org/debian bookworm/main amd64 Packages";
        assert_eq!(madison_version(m, "trixie").as_deref(), Some("6.12.117-1"));
        assert_eq!(
            madison_version(m, "trixie-backports").as_deref(),
            Some("7.3.4-1~bpo13+1")
        );
        assert_eq!(madison_version(m, "bookworm").as_deref(), Some("6.1.176-1"));
        assert_eq!(madison_version(m, "bullseye"), None);
    }

    #[test]
    fn depends_lists_package_names() {
        let show = "Package: linux-image-7.3.4+deb13-amd64\nDepends: dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, linux-binary-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-modules-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1)\nSize: 1900\n";
        assert_eq!(
            depends_of(show),
            [
                "dracut",
                "initramfs-tools",
                "linux-initramfs-tool",
                "linux-binary-7.3.4+deb13-amd64",
                "linux-modules-7.3.4+deb13-amd64"
            ]
        );
    }
}
