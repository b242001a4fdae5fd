//! An answer's shape: its body and content type, and the lines every answer carries (never
//! cached: the figures are live; never sniffed: a text is not a page). The engine frames it
//! (length, `Connection`) and writes it.

use crate::http::LocalAnswer;

/// A page: 200, HTML, in the language the request chose (`super::language`): a cache keeps
/// one per `Accept-Language`.
pub(super) fn html(page: String) -> LocalAnswer {
    body(200, "text/html; charset=utf-8", page).with("Vary", "Accept-Language")
}

/// A text for people and scripts: PING, READY, a refusal, the list of commands.
pub(super) fn text(status: u16, message: impl Into<String>) -> LocalAnswer {
    body(status, "text/plain; charset=utf-8", message.into())
}

/// A refusal's text: the connection closes after it.
pub(super) fn closing(status: u16, message: impl Into<String>) -> LocalAnswer {
    LocalAnswer {
        close: true,
        ..text(status, message)
    }
}

/// `content` as `content_type`, with `status`.
pub(super) fn body(status: u16, content_type: &'static str, content: String) -> LocalAnswer {
    LocalAnswer::new(status, content)
        .with("Content-Type", content_type)
        .with("Cache-Control", "no-cache")
        .with("X-Content-Type-Options", "nosniff")
}

/// `answer` as ADMIN sends it: never framed by another page (clickjacking a confirmation's
/// button), never stored by a cache (its pages carry the anti-forgery token). The public
/// pages are left as they are.
pub(super) fn guarded(mut answer: LocalAnswer) -> LocalAnswer {
    answer.fields.retain(|(name, _)| *name != "Cache-Control");
    answer
        .with("Cache-Control", "no-store")
        .with("X-Frame-Options", "DENY")
        .with("Content-Security-Policy", "frame-ancestors 'none'")
}
