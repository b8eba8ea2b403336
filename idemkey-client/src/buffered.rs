//! A response read to its end, from which equal responses can be made: to read a problem
//! body without losing it, and to hand one answer to several concurrent callers.

use bytes::Bytes;
use http::{Extensions, HeaderMap, StatusCode, Version};
use reqwest::Response;

/// Everything of a [`Response`] but its connection: status, version, headers, URL,
/// extensions and the whole body.
#[derive(Debug, Clone)]
pub(crate) struct Buffered {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    url: reqwest::Url,
    extensions: Extensions,
    body: Bytes,
}

impl Buffered {
    /// Reads `response` to its end.
    ///
    /// # Errors
    /// The body could not be read (the connection dropped inside it).
    pub(crate) async fn read(mut response: Response) -> Result<Self, reqwest::Error> {
        let url = response.url().clone();
        let status = response.status();
        let version = response.version();
        let headers = std::mem::take(response.headers_mut());
        let extensions = std::mem::take(response.extensions_mut());
        let body = response.bytes().await?;
        Ok(Self {
            status,
            version,
            headers,
            url,
            extensions,
            body,
        })
    }

    pub(crate) fn body(&self) -> &Bytes {
        &self.body
    }

    pub(crate) fn extensions_mut(&mut self) -> &mut Extensions {
        &mut self.extensions
    }

    /// The response, its body in memory.
    pub(crate) fn into_response(self) -> Response {
        // reqwest keeps the URL in a private extension that only its builder sets.
        let rebuilt =
            reqwest::ResponseBuilderExt::url(http::Response::builder(), self.url).body(self.body);
        #[allow(clippy::expect_used)]
        let mut rebuilt =
            rebuilt.expect("a builder given only an extension and a body cannot fail");
        *rebuilt.status_mut() = self.status;
        *rebuilt.version_mut() = self.version;
        *rebuilt.headers_mut() = self.headers;
        rebuilt.extensions_mut().extend(self.extensions);
        Response::from(rebuilt)
    }
}
