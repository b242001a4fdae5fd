//! The words messages share across the process: how a count is written. It lives in `config`,
//! the lowest layer whose messages count things (a load's `3 errors in appserver.ini`), so
//! every layer above (`broker`, `admin`, the binary...) can import it; `process`, the home of
//! what the whole process shares, stands above `config` and could not serve `config` itself.

/// `n thing` or `n things`.
pub fn plural(n: usize, thing: &str) -> String {
    if n == 1 {
        format!("{n} {thing}")
    } else {
        format!("{n} {thing}s")
    }
}
