//! `GET /debug/pprof/mmaplock[?seconds=N]` (with `--pprof`): the pprof profile of the
//! agent's last intervals, from its ring (`profiles.rs`), behind the same TLS and basic auth
//! as `/metrics` (`http.rs`).

use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
};

use super::{
    http::plain,
    profiles::{MAX_SECONDS, SharedProfiles},
};
use crate::output::{
    Output,
    pprof::{Pprof, Samples},
};

/// The path of the pprof profile.
pub const PPROF_PATH: &str = "/debug/pprof/mmaplock";

/// `?seconds=N`: None without it; a whole number of seconds from 1 to [`MAX_SECONDS`], else
/// what is wrong, in one line.
pub fn seconds(query: Option<&str>) -> Result<Option<u64>, String> {
    let Some(v) = (query.unwrap_or("").split('&'))
        .filter_map(|kv| kv.split_once('='))
        .find_map(|(k, v)| (k == "seconds").then_some(v))
    else {
        return Ok(None);
    };
    match v.parse::<u64>() {
        Ok(n) if (1..=MAX_SECONDS).contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "mmaplock-prof: seconds={v:?}: a whole number of seconds from 1 to {MAX_SECONDS} (the agent keeps the last {MAX_SECONDS} s of sampled stacks)\n"
        )),
    }
}

/// The pprof profile of the intervals that ended in the last `?seconds=N` (the last interval
/// without it).
pub fn pprof(profiles: Option<&SharedProfiles>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let Some(profiles) = profiles else {
        return plain(
            StatusCode::NOT_FOUND,
            b"mmaplock-prof: start the agent with --pprof to serve /debug/pprof/mmaplock\n",
        );
    };
    let seconds = match seconds(req.uri().query()) {
        Ok(s) => s,
        Err(e) => {
            let mut r = Response::new(Full::new(Bytes::from(e)));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            return r;
        }
    };
    let mut bytes = Vec::new();
    let encoded = match profiles.lock() {
        Ok(ring) => {
            let w = ring.window(seconds, std::time::SystemTime::now());
            Output::<dyn Samples>::emit(&mut Pprof, &w, &mut bytes)
        }
        Err(_) => return plain(StatusCode::INTERNAL_SERVER_ERROR, b"profiles unavailable\n"),
    };
    if encoded.is_err() {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, b"encoding failed\n");
    }
    Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(
            header::CONTENT_DISPOSITION,
            "attachment; filename=\"mmaplock.pb.gz\"",
        )
        .body(Full::new(Bytes::from(bytes)))
        .expect("valid headers")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_whole_and_bounded() {
        assert_eq!(seconds(None), Ok(None));
        assert_eq!(seconds(Some("debug=1")), Ok(None));
        assert_eq!(seconds(Some("seconds=14")), Ok(Some(14)));
        assert_eq!(seconds(Some("a=b&seconds=600")), Ok(Some(600)));
        for bad in [
            "seconds=0",
            "seconds=601",
            "seconds=1.5",
            "seconds=-3",
            "seconds=",
        ] {
            let e = seconds(Some(bad)).unwrap_err();
            assert!(e.contains("from 1 to 600") && e.ends_with('\n'), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
}
