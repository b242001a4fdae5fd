//! The server table: its columns in the two layouts (the TOTVS SmartClient broker's and the
//! TOTVS HTTP broker's first cells, which monitors read by position, then appbroker's own),
//! each column's cells, and the stylesheet's rules the layouts make for them.

use std::fmt::Write;

use super::words::{bytes, esc, page_link, reason, span};
use crate::balancer::rules::health::Reason;
use crate::balancer::rules::overrides::Mode;
use crate::config::Monitoring;
use crate::query::labels::Labels;
use crate::query::snapshot::{ServerState, Snapshot, Standing};
use crate::support::clock::time_of_day as clock;

/// What a column of the server table holds, which is how the stylesheet draws it, wherever
/// the layout puts it: figures right-aligned on one line, words left-aligned and wrapping.
/// The cells stay plain `<td>`s (monitors split rows on the literal `<td>`): the rules name
/// the columns by position within the table's layout class ([`Layout::rules`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CellContent {
    /// The server's link, or a short name (its id): one line.
    Name,
    /// A count or an amount of bytes: right-aligned, one line, digits of one width.
    Figure,
    /// A time of day, or `-`: one line.
    Time,
    /// A word or two (who found a failure): they wrap.
    Cause,
    /// A state and its cause: they wrap, in room for a badge.
    Words,
    /// A check's result, duration and time: in room for a passing one on one line.
    Check,
}

impl CellContent {
    /// Where its header and cells align.
    fn align(self) -> &'static str {
        match self {
            CellContent::Figure => "right",
            _ => "left",
        }
    }

    /// The rest of its cells' rule (not its header's: `Bytes from clients` may wrap over
    /// `0 B`).
    fn cells(self) -> &'static str {
        match self {
            CellContent::Name => "white-space:nowrap;",
            CellContent::Figure | CellContent::Time => {
                "font-variant-numeric:tabular-nums; white-space:nowrap;"
            }
            CellContent::Cause | CellContent::Words | CellContent::Check => "",
        }
    }

    /// The width it is given before the table shares out the rest, on a desktop (a phone
    /// shows few columns, and has no room to give).
    fn room(self) -> Option<&'static str> {
        match self {
            CellContent::Words => Some("9em"),
            CellContent::Check => Some("12em"),
            _ => None,
        }
    }
}

/// What a row's cells are made from.
struct Row<'a> {
    l: &'a Labels,
    snap: &'a Snapshot,
    s: &'a ServerState,
}

/// One column of the server table: its header, what it holds, whether a phone shows it, and
/// its cell's content (what goes between `<td>` and `</td>`).
struct Column {
    header: fn(&Labels) -> &'static str,
    holds: CellContent,
    on_phone: bool,
    /// Its cell carries the TOTVS page's state class (`inQuarantine`, `isDisabled`): the
    /// state column only.
    state_class: bool,
    cell: fn(&Row<'_>) -> String,
}

/// A layout of the server table: its class on `<table>`, and the TOTVS page's columns that
/// monitors read by position, which [`OWN_COLUMNS`] follow.
pub(super) struct Layout {
    class: &'static str,
    totvs: &'static [Column],
}

impl Layout {
    /// Every column, in order.
    fn columns(&self) -> impl Iterator<Item = &'static Column> {
        self.totvs.iter().chain(OWN_COLUMNS)
    }

    /// The stylesheet's rules for this layout's columns: each drawn by what it holds, and on
    /// a phone only those it shows.
    pub(super) fn rules(&self) -> String {
        let mut rules = String::new();
        let (mut room, mut hidden) = (Vec::new(), Vec::new());
        for (i, column) in self.columns().enumerate() {
            let (class, n, holds) = (self.class, i + 1, column.holds);
            let nth = format!("table.servers.{class} :is(th, td):nth-child({n})");
            let _ = writeln!(rules, "{nth} {{ text-align:{}; }}", holds.align());
            if !holds.cells().is_empty() {
                let _ = writeln!(
                    rules,
                    "table.servers.{class} td:nth-child({n}) {{ {} }}",
                    holds.cells()
                );
            }
            if let Some(width) = holds.room() {
                room.push(format!("{nth} {{ min-width:{width}; }}"));
            }
            if !column.on_phone {
                hidden.push(nth);
            }
        }
        let _ = writeln!(rules, "@media (min-width: 701px) {{ {} }}", room.join(" "));
        let _ = writeln!(
            rules,
            "@media (max-width: 700px) {{ {} {{ display:none; }} }}",
            hidden.join(", ")
        );
        rules
    }
}

/// A column a phone leaves out, its cell without a class: most of them.
const fn column(
    header: fn(&Labels) -> &'static str,
    holds: CellContent,
    cell: fn(&Row<'_>) -> String,
) -> Column {
    Column {
        header,
        holds,
        on_phone: false,
        state_class: false,
        cell,
    }
}

const SERVER: Column = Column {
    on_phone: true,
    ..column(
        |l| l.server,
        CellContent::Name,
        |r| {
            let address = esc(&r.s.address);
            let link = page_link(
                r.snap,
                &format!("/TOTVS_BROKER_QUERY/ServerStatus/{address}"),
            );
            format!("<a href=\"{link}\">{address}</a>")
        },
    )
};
const CONNECTIONS: Column = Column {
    on_phone: true,
    ..HTTP_CONNECTIONS
};
/// An HTTP balancer's connections: left out on a phone, where its sessions (the TOTVS HTTP
/// broker's figure) and the state take the room.
const HTTP_CONNECTIONS: Column = column(
    |l| l.connections,
    CellContent::Figure,
    |r| r.s.active.to_string(),
);
/// The TOTVS SmartClient broker's third cell: `-`, or when the quarantine ends.
const QUARANTINE_END: Column = column(
    |l| l.quarantine,
    CellContent::Time,
    |r| {
        r.s.quarantine
            .map_or_else(|| "-".into(), |(_, until)| clock(until))
    },
);
const SESSIONS: Column = Column {
    on_phone: true,
    ..column(
        |l| l.sessions,
        CellContent::Figure,
        |r| {
            let sessions = r.snap.http.as_ref().map(|h| h.sessions_of(&r.s.address));
            sessions.map_or(0, |s| s.live).to_string()
        },
    )
};
/// The TOTVS HTTP broker's fourth cell: `-`, or when the quarantine started.
const QUARANTINE_START: Column = column(
    |l| l.quarantine_since,
    CellContent::Time,
    |r| {
        r.s.quarantine
            .map_or_else(|| "-".into(), |(since, _)| clock(since))
    },
);
const REASONS: Column = column(
    |l| l.reasons,
    CellContent::Cause,
    |r| match (r.s.quarantine, r.s.reason) {
        (Some(_), Some(why)) => reason(r.l, why).to_string(),
        _ => "-".into(),
    },
);
const STATE: Column = Column {
    on_phone: true,
    state_class: true,
    ..column(|l| l.state, CellContent::Words, |r| state_cell(r.l, r.s))
};
const ID: Column = column(|l| l.id, CellContent::Name, |r| esc(&r.s.id));
const WEIGHT: Column = column(|l| l.weight, CellContent::Figure, |r| weight_cell(r.l, r.s));
const TOTAL: Column = column(
    |l| l.total_short,
    CellContent::Figure,
    |r| r.s.total.to_string(),
);
const FAILED_CONNECTS: Column = column(
    |l| l.failed_connects,
    CellContent::Figure,
    |r| r.s.failed_connects.to_string(),
);
const BYTES_IN: Column = column(
    |l| l.bytes_in,
    CellContent::Figure,
    |r| exact_bytes(r.s.bytes_to_server),
);
const BYTES_OUT: Column = column(
    |l| l.bytes_out,
    CellContent::Figure,
    |r| exact_bytes(r.s.bytes_to_client),
);
const LAST_CHECK: Column = column(
    |l| l.last_check,
    CellContent::Check,
    |r| check_cell(r.l, r.s, &r.snap.state.monitoring),
);

/// A TCP balancer's table: the TOTVS SmartClient broker's first three columns (server,
/// connections, the quarantine's end), then appbroker's own.
pub(super) const TCP_LAYOUT: Layout = Layout {
    class: "tcp",
    totvs: &[SERVER, CONNECTIONS, QUARANTINE_END],
};

/// An HTTP balancer's table: the TOTVS HTTP broker's first five columns (server, sessions,
/// connections, the quarantine's start, its reasons), then appbroker's own.
pub(super) const HTTP_LAYOUT: Layout = Layout {
    class: "http",
    totvs: &[
        SERVER,
        SESSIONS,
        HTTP_CONNECTIONS,
        QUARANTINE_START,
        REASONS,
    ],
};

/// The columns of appbroker's own, after the TOTVS page's in either layout.
const OWN_COLUMNS: &[Column] = &[
    STATE,
    ID,
    WEIGHT,
    TOTAL,
    FAILED_CONNECTS,
    BYTES_IN,
    BYTES_OUT,
    LAST_CHECK,
];

/// `12.3 MiB`, the exact count in its tooltip.
fn exact_bytes(n: u64) -> String {
    format!("<span title='{n} bytes'>{}</span>", bytes(n))
}

/// The weight in use, and when an operator set it, the file's below it (`ctl show`'s
/// `weight set (file: 2)`), short enough to keep the column narrow.
fn weight_cell(l: &Labels, s: &ServerState) -> String {
    match s.overrides.weight {
        Some(_) => format!(
            "{}<br><small class='override' title='{}'>{}: {}</small>",
            s.weight, l.weight_set, l.weight_file, s.file_weight
        ),
        None => s.weight.to_string(),
    }
}

pub(super) fn server_table(out: &mut String, l: &Labels, snap: &Snapshot) {
    let layout = if snap.state.kind.is_http() {
        &HTTP_LAYOUT
    } else {
        &TCP_LAYOUT
    };
    let _ = write!(
        out,
        "<div class='card'><h2>Servers ({})</h2><div class='scroll'><table class='servers {}'><tr>",
        snap.state.servers.len(),
        layout.class
    );
    for column in layout.columns() {
        let _ = write!(out, "<th>{}</th>", (column.header)(l));
    }
    out.push_str("</tr>");
    for s in &snap.state.servers {
        // Plain `<td>`s but the state's: peder1981's monitor before its 35a8f98 splits the
        // row on the literal `<td>` (alignment: the stylesheet, by the table's class).
        let class = match s.state {
            Standing::Quarantined => " class='inQuarantine'",
            Standing::Draining | Standing::Disabled => " class='isDisabled'",
            Standing::Available => "",
        };
        let row = Row { l, snap, s };
        out.push_str("<tr>");
        for column in layout.columns() {
            let class = if column.state_class { class } else { "" };
            let _ = write!(out, "<td{class}>{}</td>", (column.cell)(&row));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table></div></div>");
}

pub(super) fn state_cell(l: &Labels, s: &ServerState) -> String {
    let mut cell = standing_cell(l, s);
    // The last restart, beside the server: whether the fix it needed came, and how it went.
    if let Some(r) = &s.restarted {
        let _ = write!(
            cell,
            "<br><small class='restart' title='{}'>{} {}, {}</small>",
            esc(&r.output),
            l.restarted,
            clock(r.at_wall_ms),
            esc(&r.outcome)
        );
    }
    cell
}

/// The state cell but the last restart.
fn standing_cell(l: &Labels, s: &ServerState) -> String {
    match s.state {
        Standing::Available => {
            let mut cell = format!("<span class='badge ok'>{}</span>", l.available);
            // Only an error that still stands: one the server has proved itself past is
            // history (its ServerStatus page keeps it), not what a reader should act on.
            if let Some((at, words)) = current_error(l, s) {
                let _ = write!(
                    cell,
                    "<br><small>{} {} {at}: {words}</small>",
                    l.error, l.at
                );
            }
            cell
        }
        Standing::Draining => format!("<span class='badge warn'>{}</span>", l.draining_server),
        Standing::Disabled => {
            // An operator's hold: disabled or draining, by whom and why.
            let Some(hold) = &s.overrides.hold else {
                return format!("<span class='badge warn'>{}</span>", l.disabled_count.0);
            };
            let badge = match hold.mode {
                Mode::Drain => l.draining_count.0,
                Mode::Disabled => l.disabled_count.0,
            };
            let reason = match hold.reason.as_str() {
                "" => String::new(),
                reason => format!(": {}", esc(reason)),
            };
            format!(
                "<span class='badge warn'>{badge}</span><br><small>{} {}{reason}</small>",
                l.by,
                esc(&hold.by)
            )
        }
        Standing::Quarantined => {
            // The end time again: on a phone the quarantine column is hidden.
            let until = s
                .quarantine
                .map(|(_, until)| format!("{} {}", l.until, clock(until)))
                .unwrap_or_default();
            format!(
                "<span class='badge bad'>{}</span><br><small>{until} · {}</small>",
                l.quarantined,
                quarantine_cause(l, s)
            )
        }
    }
}

/// Why a server is in quarantine, for its state cell: an operator's who and why (never an
/// old error: the server may be healthy), or who found the failure, when, and the error.
fn quarantine_cause(l: &Labels, s: &ServerState) -> String {
    if let Some(asked) = &s.asked {
        return esc(&l.words(&asked.words()));
    }
    if s.forced || s.reason == Some(Reason::Operator) {
        return l.by_operator.to_string();
    }
    // Who found it is left out on a phone, to keep the row low, and on an HTTP balancer's
    // page, whose Reasons column says it. When is the quarantine's: its end here, its start
    // in the HTTP layout's column.
    let who = s.reason.map_or("", |r| reason(l, r));
    match current_error(l, s) {
        Some((_, words)) => format!("<span class='why'>{who}: </span>{words}"),
        None => who.to_string(),
    }
}

/// The server's last error while it stands: when it came and its words, for a page.
fn current_error(l: &Labels, s: &ServerState) -> Option<(String, String)> {
    let words = s.last_error.as_deref().filter(|_| s.error_current)?;
    Some((clock(s.last_error_wall_ms), esc(&l.words(words))))
}

pub(super) fn check_cell(l: &Labels, s: &ServerState, monitoring: &Monitoring) -> String {
    match (&s.last_check, monitoring) {
        (_, Monitoring::Disabled) => format!("<span class='muted'>{}</span>", monitoring.as_str()),
        (None, _) => format!("<span class='muted'>{}</span>", l.never),
        (Some(check), _) => match &check.error {
            None => format!(
                "<span class='line'>OK <small>{} · {}</small></span>",
                span(check.duration),
                clock(check.at_wall_ms)
            ),
            // Its result and when on one line, as a passing one's; why below.
            Some(error) => format!(
                "<span class='line'><span class='failed'>{}</span> <small>{} · {}</small></span>\
                 <br><small>{}</small>",
                l.failed,
                span(check.duration),
                clock(check.at_wall_ms),
                esc(&l.words(error))
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Language;
    use crate::query::labels::of;

    #[test]
    fn each_layout_draws_its_columns_by_what_they_hold() {
        for layout in [&TCP_LAYOUT, &HTTP_LAYOUT] {
            let rules = layout.rules();
            let l = of(Language::English);
            for (i, column) in layout.columns().enumerate() {
                let nth = format!(
                    "table.servers.{} :is(th, td):nth-child({})",
                    layout.class,
                    i + 1
                );
                let align = format!("{nth} {{ text-align:{}; }}", column.holds.align());
                assert!(rules.contains(&align), "{}: {rules}", (column.header)(l));
            }
            // A phone: the server, a figure, the state; nothing else.
            let phone: Vec<&str> = layout
                .columns()
                .filter(|c| c.on_phone)
                .map(|c| (c.header)(l))
                .collect();
            let figure = if layout.class == "http" {
                "Sessions"
            } else {
                "Connections"
            };
            assert_eq!(phone, ["Server", figure, "State"], "{}", layout.class);
        }
        // The monitors' cells come first, in the TOTVS pages' order.
        let headers = |layout: &Layout| -> Vec<&str> {
            let l = of(Language::English);
            layout.columns().map(|c| (c.header)(l)).collect()
        };
        assert_eq!(
            headers(&TCP_LAYOUT)[..3],
            ["Server", "Connections", "Quarantine"]
        );
        assert_eq!(
            headers(&HTTP_LAYOUT)[..5],
            [
                "Server",
                "Sessions",
                "Connections",
                "Quarantine since",
                "Reasons"
            ]
        );
    }
}
