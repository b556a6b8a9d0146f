//! Debian's kernel packages, fetched with `apt-get download` from the Debian archive the
//! machine's apt configuration names (`apt_sources`), through sources and package lists of
//! our own (the machine's are never changed), unpacked with `dpkg -x` and kept in
//! `~/.cache/mmaplock-prof/kernels/NAME` like the tests' Node versions.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{Arch, KERNELS, Kernel, apt_sources};

/// A kernel ready to boot: its image, and the tree whose `lib/modules` virtme-ng uses.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub vmlinuz: PathBuf,
    /// `uname -r` of that kernel.
    pub release: String,
    /// Its modules (`lib/modules/RELEASE` or `usr/lib/modules/RELEASE` in the unpacked tree).
    pub modules: PathBuf,
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
    let suites: Vec<&str> = KERNELS
        .iter()
        .filter(|o| o.arch == k.arch)
        .map(|o| o.suite)
        .collect();
    // One apt per architecture: its package lists are of that architecture alone.
    let apt_dir = match k.arch {
        Arch::X86_64 => kernels_dir().join("apt"),
        other => kernels_dir().join(format!("apt-{}", other.debian())),
    };
    let apt = PrivateApt::new(&apt_dir, &suites, k.arch)?;
    let update_errors = apt.update()?;
    let meta = format!("linux-image-{}", k.arch.debian());
    let version = apt.suite_version(&meta, k.suite, &update_errors)?;
    // The meta package names the image; newer packaging splits it into image, binary and
    // modules packages, all of one version (trixie-backports' amd64 kernel; its arm64 6.12
    // is one package).
    let image = apt
        .depends(&meta, &version)?
        .into_iter()
        .find(|d| d.starts_with("linux-image-"))
        .with_context(|| format!("{meta} depends on no linux-image-*"))?;
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
                modules: PathBuf::new(),
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
                vmlinuz.exists().then_some(Fetched {
                    vmlinuz,
                    release,
                    modules: PathBuf::new(),
                })
            })
    };
    let mut f = in_boot.or_else(in_modules)?;
    f.modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| root.join(m).join(&f.release))
        .find(|m| m.join("kernel").exists())?;
    Some(f)
}

/// apt with lists, cache and sources of its own, under `dir`: Debian suites of one
/// architecture from the Debian archives the machine's apt configuration names.
pub struct PrivateApt {
    options: Vec<String>,
    /// The archives' URIs, for messages.
    uris: String,
}

impl PrivateApt {
    pub fn new(dir: &Path, suites: &[&str], arch: Arch) -> Result<Self> {
        let archives = apt_sources::host_archives()?;
        for d in [
            "lists/partial",
            "cache/archives/partial",
            "etc/sources.list.d",
        ] {
            std::fs::create_dir_all(dir.join(d))?;
        }
        let mut suites = suites.to_vec();
        suites.dedup();
        let keyring = Path::new(apt_sources::DEBIAN_KEYRING);
        let sources =
            apt_sources::private_sources(&archives, &suites, keyring.exists().then_some(keyring));
        let list = dir.join("etc/sources.list");
        std::fs::write(&list, "")?;
        std::fs::write(dir.join("etc/sources.list.d/debian.sources"), sources)?;
        let d = |p: &str| dir.join(p).display().to_string();
        let uris: Vec<String> = archives.iter().flat_map(|a| a.uris.clone()).collect();
        let mut options = vec![
            format!("Dir::Etc::sourcelist={}", list.display()),
            format!("Dir::Etc::sourceparts={}", d("etc/sources.list.d")),
            format!("Dir::State::Lists={}", d("lists")),
            format!("Dir::Cache={}", d("cache")),
            "Dir::State::status=/dev/null".into(),
            // Root downloads into our own directories, which _apt cannot enter.
            "APT::Sandbox::User=root".into(),
        ];
        if arch != Arch::X86_64 {
            // Another architecture's packages only: apt takes it for the native one.
            options.push(format!("APT::Architecture={}", arch.debian()));
            options.push(format!("APT::Architectures::={}", arch.debian()));
        }
        Ok(PrivateApt {
            options,
            uris: uris.join(", "),
        })
    }

    pub fn command(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        for o in &self.options {
            c.arg("-o").arg(o);
        }
        c.env("DEBIAN_FRONTEND", "noninteractive");
        c
    }

    /// The package lists, fetched anew. A mirror may lack a suite (an old release removed,
    /// a partial mirror): apt then fails for it alone, and what it said is returned, for the
    /// message of a kernel that cannot be found.
    pub fn update(&self) -> Result<String> {
        let out = self.command("apt-get").args(["update", "-qq"]).output()?;
        if out.status.success() {
            return Ok(String::new());
        }
        let said = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = said.lines().filter(|l| l.starts_with("E:")).collect();
        Ok(format!(" (apt-get update: {})", errors.join(" ")))
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
    fn suite_version(&self, package: &str, suite: &str, update_errors: &str) -> Result<String> {
        let madison = self.output("apt-cache", &["madison", package])?;
        madison_version(&madison, suite).with_context(|| {
            format!(
                "the Debian archive of this machine's apt configuration ({}) has no {package} in {suite}{update_errors}",
                self.uris
            )
        })
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
        let m = "linux-image-amd64 | 7.3.4-1~bpo13+1 | http://mirror.example/debian trixie-backports/main amd64 Packages
linux-image-amd64 | 6.12.118-1 | http://mirror.example/debian-security trixie-security/main amd64 Packages
linux-image-amd64 | 6.12.117-1 | http://mirror.example/debian trixie/main amd64 Packages
linux-image-amd64 |  6.1.176-1 | http://mirror.example/debian bookworm/main amd64 Packages";
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
