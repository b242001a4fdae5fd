//! An answer's HTTP shape: its body and content type, and the headers every answer carries
//! (never cached: the figures are live; never sniffed: a text is not a page).

use bytes::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

/// A page: 200, HTML, in the language the request chose (`super::language`): a cache keeps
/// one per `Accept-Language`.
pub(super) fn html(page: String) -> Response<Bytes> {
    let mut response = body(StatusCode::OK, "text/html; charset=utf-8", page);
    response
        .headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept-Language"));
    response
}

/// A text for people and scripts: PING, READY, a refusal, the list of commands.
pub(super) fn text(status: StatusCode, message: String) -> Response<Bytes> {
    body(status, "text/plain; charset=utf-8", message)
}

/// `content` as `content_type`, with `status`.
pub(super) fn body(
    status: StatusCode,
    content_type: &'static str,
    content: String,
) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(content));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}
