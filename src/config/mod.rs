//! `appserver.ini` to a validated [`Config`]: typed ports, durations and addresses, TOTVS keys
//! accepted with notices, and every error naming file, line, section and key.
//!
//! Reading goes in three steps: [`ini::scan`] turns text into sections and entries with line
//! numbers, [`Config::from_text`] validates them into typed values (collecting every error
//! rather than stopping at the first), and [`Config::to_ini`] prints the effective
//! configuration back, which parses to the same [`Config`].
//!
//! - `load`: a file read (a regular file, bounded), decoded and validated
//!   ([`Config::from_path`]), or one `[General]` value read whatever errors the file holds
//!   ([`general_value`]).
//! - `ini`: the line scanner: text to sections and entries, each with its line number.
//! - [`keys`]: every configuration key in one table, which drives parsing, printing, reload
//!   and docs.
//! - `value`: parsers for single values and their canonical printed forms.
//! - `validate`: scanned entries to a typed [`Config`], every error collected.
//! - `model`: [`Config`] and its parts as the broker uses them, their defaults (written
//!   once: the HTTP engine's are read from here), the TOTVS keys accepted unused, and
//!   [`Loaded`].
//! - `choices`: the values the enum-valued keys take (`LANGUAGE`, `SORT_METHOD`,
//!   `MONITORING_TYPE`...), parsed and printed.
//! - `errors`: what is wrong, in the operator's words: [`ConfigError`] (and [`Notice`]),
//!   [`LoadError`], [`ValueError`].
//! - `render`: the effective configuration printed back as INI (`--check`, CFG).
//! - [`self_loop`]: whether a server's address is the broker's own (a loop), for the checks
//!   here and every connect.
//! - `words`: how messages across the process write a count ([`plural`],
//!   [`connections_stay`]).
//! - `alerting`: what the `ALERT_*` and `RESTART_*` keys hold: the events alerts are sent for,
//!   the webhook (a secret URL), the commands, the restarts' bounds.

mod alerting;
mod choices;
mod errors;
mod ini;
pub mod keys;
mod load;
mod model;
mod render;
pub mod self_loop;
mod validate;
mod value;
mod words;

pub use alerting::{
    ALERT_EVENT_WORDS, AlertEvent, AlertEvents, AlertFormat, AlertSettings, RestartSettings,
    Webhook, command_text,
};
pub use choices::{
    Language, Monitoring, ProxyVersion, SortMethod, StatusRange, TOTVS_MONITORING_TYPES,
    TOTVS_SORT_METHODS,
};
pub use errors::{ConfigError, LoadError, MAX_ERRORS_SHOWN, MAX_FILE_SIZE, Notice, ValueError};
pub use load::general_value;
pub use model::{
    BalancerConfig, BalancerKind, Config, DEFAULT_HTTP_HEAD_MEMORY, General, HttpSettings,
    Keepalive, Loaded, Origins, ProxyProtocol, QuerySettings, ServerConfig, TOTVS_GENERAL,
    TOTVS_UNUSED, TlsKeys, ValueOrigin,
};
pub use render::{EffectiveSection, balancer_secret_changes, secret_changes, setting_changes};
pub use value::{Cidr, Host, ServerId, duration_within, show_duration, show_escaped};
pub use words::{connections_stay, plural};

#[cfg(test)]
mod tests;
