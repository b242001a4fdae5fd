//! The broker's own answers (no server available, a server that failed, a refused request):
//! a short HTML page in the balancer's language that says what happened and what to do.

use bytes::Bytes;
use hyper::StatusCode;

use crate::config::Language;

/// The title and the sentence of the page for `status`.
fn words(status: StatusCode, language: Language) -> (&'static str, &'static str) {
    match (status.as_u16(), language) {
        (503, Language::English) => (
            "No server available",
            "No server of this service can take the request now. Try again in a few seconds.",
        ),
        (503, Language::Portuguese) => (
            "Nenhum servidor disponível",
            "Nenhum servidor deste serviço pode atender agora. Tente novamente em alguns segundos.",
        ),
        (502, Language::English) => (
            "Server failed",
            "The server failed while answering this request. Try again.",
        ),
        (502, Language::Portuguese) => (
            "Falha no servidor",
            "O servidor falhou ao responder esta requisição. Tente novamente.",
        ),
        (504, Language::English) => (
            "Server timed out",
            "The server did not answer this request in time. Try again.",
        ),
        (504, Language::Portuguese) => (
            "Tempo esgotado",
            "O servidor não respondeu esta requisição a tempo. Tente novamente.",
        ),
        (501, Language::English) => (
            "Not implemented",
            "The broker does not pass this kind of request on (CONNECT, or a transfer coding \
             other than chunked).",
        ),
        (501, Language::Portuguese) => (
            "Não implementado",
            "O broker não repassa este tipo de requisição (CONNECT, ou uma codificação de \
             transferência que não seja chunked).",
        ),
        (408, Language::English) => (
            "Request timed out",
            "The request's body stopped arriving before it was complete. Check the network and \
             try again.",
        ),
        (408, Language::Portuguese) => (
            "Tempo da requisição esgotado",
            "O corpo da requisição parou de chegar antes de completo. Verifique a rede e tente \
             novamente.",
        ),
        (414, Language::English) => (
            "Address too long",
            "The requested address is longer than the broker accepts.",
        ),
        (414, Language::Portuguese) => (
            "Endereço longo demais",
            "O endereço pedido é mais longo do que o broker aceita.",
        ),
        (_, Language::English) => (
            "Bad request",
            "The request is not valid HTTP/1.1 (a Host header is required, and only one).",
        ),
        (_, Language::Portuguese) => (
            "Requisição inválida",
            "A requisição não é HTTP/1.1 válido (o cabeçalho Host é obrigatório, e único).",
        ),
    }
}

/// The page for `status` in `language`.
pub(crate) fn page(status: StatusCode, language: Language) -> Bytes {
    let (title, sentence) = words(status, language);
    Bytes::from(html(status.as_u16(), title, sentence, language))
}

/// The short HTML page every answer of the broker's own uses.
fn html(code: u16, title: &str, sentence: &str, language: Language) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"{lang}\"><head><meta charset=\"utf-8\">\
         <title>{code} {title}</title></head>\n<body><h1>{code} {title}</h1>\n\
         <p>{sentence}</p>\n<p><small>appbroker</small></p></body></html>\n",
        lang = language.as_str(),
    )
}

/// The whole answer (status line, headers, page) to a plain HTTP request that reached a port
/// speaking only TLS: 400, saying to use https (nginx answers the same case with its "plain
/// HTTP request was sent to HTTPS port"). Written before the TLS engine, so it is raw bytes.
pub fn plain_http_to_tls_port(language: Language) -> Bytes {
    let (title, sentence) = match language {
        Language::English => (
            "Use https",
            "This port speaks HTTPS only: open the same address with https:// instead of http://.",
        ),
        Language::Portuguese => (
            "Use https",
            "Esta porta aceita somente HTTPS: abra o mesmo endereço com https:// em vez de http://.",
        ),
    };
    let body = html(400, title, sentence, language);
    Bytes::from(format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/html; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_is_in_its_language() {
        for code in [400, 408, 414, 501, 502, 503, 504] {
            let Ok(status) = StatusCode::from_u16(code) else {
                panic!("status")
            };
            let en = String::from_utf8_lossy(&page(status, Language::English)).into_owned();
            let pt = String::from_utf8_lossy(&page(status, Language::Portuguese)).into_owned();
            assert!(en.contains(&format!("<h1>{code} ")), "{en}");
            assert!(en.contains("lang=\"en\""));
            assert!(pt.contains("lang=\"pt-BR\""));
            assert_ne!(
                words(status, Language::English).1,
                words(status, Language::Portuguese).1
            );
        }
        let pt = page(StatusCode::SERVICE_UNAVAILABLE, Language::Portuguese);
        assert!(String::from_utf8_lossy(&pt).contains("Nenhum servidor disponível"));
    }
}
