//! The HTML pages in a real browser: headless Chromium (Debian's, which `cargo xtask test`
//! installs) with every network request made to fail, and what the rendered page holds.

use std::{path::Path, process::Command};

use serde_json::Value;

use crate::installed_or_skip;

/// Headless Chromium (Debian's), for the HTML reports.
const CHROMIUM: &str = "/usr/bin/chromium";

/// The DOM of `page` after chromium loaded and ran it, with the network cut (a proxy that
/// does not exist, and no name resolving); None when chromium is not installed (outside CI).
/// Fails if the page asked for anything over the network (see `page_requests`).
pub fn rendered_dom(page: &Path, screenshot: Option<&Path>) -> Option<String> {
    let (dom, requests) = render(page, screenshot)?;
    assert!(
        requests.is_empty(),
        "{} fetched from the network: {requests:?}",
        page.display()
    );
    Some(dom)
}

/// What the page itself asked the network for while chromium rendered it, from chromium's
/// net log: requests made on behalf of a `file://` document (chromium's own background
/// requests have no such document), other than `file:`, `data:` and `about:` URLs. None when
/// chromium is not installed (outside CI).
pub fn page_requests(page: &Path) -> Option<Vec<String>> {
    render(page, None).map(|(_, r)| r)
}

fn render(page: &Path, screenshot: Option<&Path>) -> Option<(String, Vec<String>)> {
    installed_or_skip(Path::new(CHROMIUM).exists().then_some(()), "chromium")?;
    static RENDERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let profile = std::env::temp_dir().join(format!(
        "mmaplock-chromium-{}-{}",
        std::process::id(),
        RENDERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&profile);
    std::fs::create_dir_all(&profile).expect("chromium profile directory");
    let net_log = profile.join("net-log.json");
    let mut cmd = Command::new(CHROMIUM);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--proxy-server=127.0.0.1:9",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--window-size=1280,2600",
        "--hide-scrollbars",
        // Scripts (the flame graph's) have run before the DOM is dumped.
        "--virtual-time-budget=2000",
    ])
    .arg(format!(
        "--user-data-dir={}",
        profile.join("user").display()
    ))
    .arg(format!("--log-net-log={}", net_log.display()));
    match screenshot {
        Some(png) => cmd.arg(format!("--screenshot={}", png.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = cmd
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read(&net_log).expect("chromium wrote its net log");
    let _ = std::fs::remove_dir_all(&profile);
    let log: Value = serde_json::from_slice(&log).expect("chromium's net log is JSON");
    let mut requests: Vec<String> = log["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["params"]["network_isolation_key"]
                .as_str()
                .is_some_and(|k| k.contains("file://"))
        })
        .filter_map(|e| e["params"]["url"].as_str())
        .filter(|u| {
            !["file:", "data:", "about:"]
                .iter()
                .any(|s| u.starts_with(s))
        })
        .map(str::to_string)
        .collect();
    requests.sort();
    requests.dedup();
    Some((String::from_utf8_lossy(&out.stdout).into_owned(), requests))
}

/// Nothing in the page points outside it: no `src`, `href` or CSS `url()` to another host.
pub fn assert_self_contained(dom: &str) {
    for needle in [
        "src=\"http",
        "href=\"http",
        "url(http",
        "@import",
        "src='http",
    ] {
        assert!(
            !dom.contains(needle),
            "the page fetches something: {needle}"
        );
    }
}

pub fn charts(dom: &str) -> Vec<String> {
    dom.match_indices("data-chart=\"")
        .map(|(i, _)| {
            let rest = &dom[i + 12..];
            rest[..rest.find('"').unwrap()].to_string()
        })
        .collect()
}

/// The rendered DOM of `page` (which must fetch nothing, and point at nothing outside it)
/// and its charts' names; None when chromium is not installed (outside CI).
pub fn rendered_charts(page: &Path) -> Option<(String, Vec<String>)> {
    let dom = rendered_dom(page, None)?;
    assert_self_contained(&dom);
    let found = charts(&dom);
    Some((dom, found))
}

/// Every chart of `want` is among those `found`.
pub fn assert_charts(found: &[String], want: &[&str]) {
    for w in want {
        assert!(found.iter().any(|c| c == w), "no {w} chart in {found:?}");
    }
}
