//! The words messages share across the process: how a count is written, and a verb after it
//! that agrees with it. It lives in `config`, the lowest layer whose messages count things (a
//! load's `3 errors in appserver.ini`), so every layer above (`broker`, `admin`, the
//! binary...) can import it; `support`, the home of what the whole process shares, stands
//! above `config` and could not serve `config` itself.

/// `n thing` or `n things`.
pub fn plural(n: usize, thing: &str) -> String {
    if n == 1 {
        format!("{n} {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// What becomes of a server's open connections when an operator holds it out (`ctl disable`,
/// `drain`), in words that agree with the count: `its 3 open connections stay`, `its one open
/// connection stays`, `it has no open connection`.
pub fn connections_stay(open: usize) -> String {
    match open {
        0 => "it has no open connection".to_string(),
        1 => "its one open connection stays".to_string(),
        n => format!("its {n} open connections stay"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verb_agrees_with_the_count() {
        assert_eq!(connections_stay(0), "it has no open connection");
        assert_eq!(connections_stay(1), "its one open connection stays");
        assert_eq!(connections_stay(12), "its 12 open connections stay");
    }
}
