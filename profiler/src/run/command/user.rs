//! Who a COMMAND runs as. Under sudo the profiler is root, but the command is the user's: their
//! test suite, their build, writing into their home and their project as they would without
//! the profiler. sudo says who ran it (`SUDO_UID`, `SUDO_GID`, `SUDO_USER`); the command then
//! runs with that user's ids and supplementary groups, never as root, in the environment sudo
//! passed, except where sudo pointed it at root's own account (`HOME`, `USER`, `LOGNAME`
//! naming root: npm would write its cache into /root and fail).

use std::ffi::{CStr, CString, OsStr, OsString};

/// The ids a command runs with, set in the child before it execs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary one included, as `initgroups` makes them).
    pub groups: Vec<u32>,
}

/// An account, as the password database has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub home: OsString,
}

/// The password and group databases (NSS), behind a trait so that the rules can be tested
/// with accounts of their own.
pub trait Accounts {
    fn by_uid(&self, uid: u32) -> Option<Account>;
    fn by_name(&self, name: &str) -> Option<Account>;
    /// `name`'s groups, `gid` among them.
    fn groups(&self, name: &str, gid: u32) -> Option<Vec<u32>>;
}

/// Why the command cannot be run as the user who ran sudo.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UserError {
    #[error("{0}={1:?} is not a user or group id")]
    BadId(&'static str, String),
    #[error("SUDO_UID is set without SUDO_GID: cannot tell which group to run the command as")]
    NoGid,
}

/// Who runs the command, and what changes in its environment.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RunAs {
    /// None: as the profiler itself.
    pub ids: Option<Ids>,
    /// Variables set for the command (the rest of the environment is passed as it is).
    pub env: Vec<(OsString, OsString)>,
}

fn id_of(var: &'static str, v: &OsStr) -> Result<u32, UserError> {
    v.to_str()
        .and_then(|s| s.parse::<u32>().ok())
        .ok_or_else(|| UserError::BadId(var, v.to_string_lossy().into_owned()))
}

/// Who runs the command: the user sudo names when the profiler runs as root with `SUDO_UID`
/// set to another user, else the profiler's own user. `env` reads the environment.
pub fn run_as(
    euid: u32,
    env: impl Fn(&str) -> Option<OsString>,
    db: &dyn Accounts,
) -> Result<RunAs, UserError> {
    let Some(uid) = env("SUDO_UID") else {
        return Ok(RunAs::default());
    };
    let uid = id_of("SUDO_UID", &uid)?;
    if euid != 0 || uid == 0 {
        // Not root (the ids could not be changed), or sudo run by root itself.
        return Ok(RunAs::default());
    }
    let gid = id_of("SUDO_GID", &env("SUDO_GID").ok_or(UserError::NoGid)?)?;
    let named = env("SUDO_USER").and_then(|n| n.into_string().ok());
    // The account sudo names, if it is this uid's (sudo -u, or a database that changed).
    let account = match named.as_deref().and_then(|n| db.by_name(n)) {
        Some(a) if a.uid == uid => Some(a),
        _ => db.by_uid(uid),
    };
    let groups = account
        .as_ref()
        .and_then(|a| db.groups(&a.name, gid))
        .unwrap_or_else(|| vec![gid]);
    let mut set = Vec::new();
    if let Some(a) = &account {
        let root_home = db.by_uid(0).map(|r| r.home);
        let home = env("HOME");
        if home.is_none() || home == root_home || home.as_deref() == Some(OsStr::new("/root")) {
            set.push(("HOME".into(), a.home.clone()));
        }
        for var in ["USER", "LOGNAME"] {
            if env(var).is_none_or(|v| v == "root") {
                set.push((var.into(), a.name.clone().into()));
            }
        }
    }
    Ok(RunAs {
        ids: Some(Ids { uid, gid, groups }),
        env: set,
    })
}

/// The system's databases, through libc (getpwuid_r, getpwnam_r, getgrouplist).
pub struct System;

impl System {
    fn entry(
        lookup: impl Fn(*mut libc::passwd, &mut [u8], *mut *mut libc::passwd) -> i32,
    ) -> Option<Account> {
        let mut buf = vec![0u8; 16 << 10];
        // SAFETY: a zeroed passwd is a valid out-parameter; getpw*_r fill it with pointers
        // into `buf`, which outlives every read below.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        if lookup(&mut pw, &mut buf, &mut found) != 0 || found.is_null() {
            return None;
        }
        // SAFETY: a found entry's strings are NUL-terminated, in `buf`.
        let (name, home) = unsafe { (CStr::from_ptr(pw.pw_name), CStr::from_ptr(pw.pw_dir)) };
        use std::os::unix::ffi::OsStrExt as _;
        Some(Account {
            name: name.to_string_lossy().into_owned(),
            uid: pw.pw_uid,
            home: OsStr::from_bytes(home.to_bytes()).to_os_string(),
        })
    }
}

impl Accounts for System {
    fn by_uid(&self, uid: u32) -> Option<Account> {
        System::entry(|pw, buf, found| {
            // SAFETY: the buffer's pointer and length are its own.
            unsafe { libc::getpwuid_r(uid, pw, buf.as_mut_ptr().cast(), buf.len(), found) }
        })
    }

    fn by_name(&self, name: &str) -> Option<Account> {
        let c = CString::new(name).ok()?;
        System::entry(|pw, buf, found| {
            // SAFETY: as above; `c` is NUL-terminated.
            unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf.as_mut_ptr().cast(), buf.len(), found) }
        })
    }

    fn groups(&self, name: &str, gid: u32) -> Option<Vec<u32>> {
        let c = CString::new(name).ok()?;
        let mut n: libc::c_int = 64;
        loop {
            let mut groups = vec![0 as libc::gid_t; n as usize];
            let asked = n;
            // SAFETY: `groups` has room for `n` ids; getgrouplist says how many it needed.
            let r = unsafe { libc::getgrouplist(c.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
            if r >= 0 {
                groups.truncate(n as usize);
                return Some(groups);
            }
            if n <= asked || n > 65536 {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// root and one user in two more groups.
    struct Db;

    impl Accounts for Db {
        fn by_uid(&self, uid: u32) -> Option<Account> {
            match uid {
                0 => self.by_name("root"),
                4242 => self.by_name("ada"),
                _ => None,
            }
        }
        fn by_name(&self, name: &str) -> Option<Account> {
            let (uid, home) = match name {
                "root" => (0, "/root"),
                "ada" => (4242, "/home/ada"),
                _ => return None,
            };
            Some(Account {
                name: name.into(),
                uid,
                home: home.into(),
            })
        }
        fn groups(&self, name: &str, gid: u32) -> Option<Vec<u32>> {
            (name == "ada").then(|| vec![gid, 27, 100])
        }
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        let m: HashMap<&str, &str> = vars.iter().copied().collect();
        move |k| m.get(k).map(OsString::from)
    }

    #[test]
    fn under_sudo_the_command_is_the_users_with_their_groups_and_home() {
        let vars = [
            ("SUDO_UID", "4242"),
            ("SUDO_GID", "4300"),
            ("SUDO_USER", "ada"),
            ("HOME", "/root"),
            ("USER", "root"),
            ("LOGNAME", "root"),
        ];
        let r = run_as(0, env(&vars), &Db).unwrap();
        assert_eq!(
            r.ids,
            Some(Ids {
                uid: 4242,
                gid: 4300,
                groups: vec![4300, 27, 100]
            })
        );
        let set: HashMap<_, _> = r.env.into_iter().collect();
        assert_eq!(set[OsStr::new("HOME")], "/home/ada");
        assert_eq!(set[OsStr::new("USER")], "ada");
        assert_eq!(set[OsStr::new("LOGNAME")], "ada");
        // A HOME sudo kept (sudo -E, or a policy that keeps it) stays.
        let vars = [
            ("SUDO_UID", "4242"),
            ("SUDO_GID", "4300"),
            ("HOME", "/srv/ci"),
        ];
        let r = run_as(0, env(&vars), &Db).unwrap();
        assert!(r.env.iter().all(|(k, _)| k != "HOME"), "{:?}", r.env);
    }

    #[test]
    fn ids_no_database_knows_run_with_their_group_alone() {
        let vars = [
            ("SUDO_UID", "54321"),
            ("SUDO_GID", "54322"),
            ("SUDO_USER", "ghost"),
            ("HOME", "/root"),
        ];
        let r = run_as(0, env(&vars), &Db).unwrap();
        assert_eq!(
            r.ids,
            Some(Ids {
                uid: 54321,
                gid: 54322,
                groups: vec![54322]
            })
        );
        // Nothing is known of the account: the environment is sudo's.
        assert!(r.env.is_empty());
        // A SUDO_USER that is another uid's account is not taken for this one.
        let vars = [
            ("SUDO_UID", "54321"),
            ("SUDO_GID", "1"),
            ("SUDO_USER", "ada"),
        ];
        assert_eq!(
            run_as(0, env(&vars), &Db).unwrap().ids.unwrap().groups,
            vec![1]
        );
    }

    #[test]
    fn not_under_sudo_or_not_root_or_sudo_by_root_runs_as_the_profiler() {
        assert_eq!(run_as(0, env(&[]), &Db).unwrap(), RunAs::default());
        let vars = [("SUDO_UID", "4242"), ("SUDO_GID", "4300")];
        assert_eq!(run_as(1000, env(&vars), &Db).unwrap(), RunAs::default());
        let vars = [("SUDO_UID", "0"), ("SUDO_GID", "0")];
        assert_eq!(run_as(0, env(&vars), &Db).unwrap(), RunAs::default());
    }

    #[test]
    fn ids_that_are_not_numbers_or_a_missing_group_are_refused() {
        let vars = [("SUDO_UID", "ada"), ("SUDO_GID", "1")];
        assert_eq!(
            run_as(0, env(&vars), &Db),
            Err(UserError::BadId("SUDO_UID", "ada".into()))
        );
        assert_eq!(
            run_as(0, env(&[("SUDO_UID", "7")]), &Db),
            Err(UserError::NoGid)
        );
    }
}
