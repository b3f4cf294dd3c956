//! `/metrics` compressed for a scraper that asks for it (Prometheus sends `Accept-Encoding:
//! gzip`): about a tenth of the bytes at 10,000 routes, where the text is megabytes.
//!
//! The body has two parts that change at different rates: the agent's own families change with
//! the loop's state, the traffic families with every request. The first is deflated once per
//! change and kept ([`Deflated`]), ending on a full flush: a byte boundary after which nothing
//! refers back into it. Each scrape deflates only the traffic part with a fresh compressor and
//! appends it, and the result is one gzip member with one checksum over the whole text. Two
//! members concatenated would be simpler and valid gzip, but some clients (curl among them)
//! decode only the first and would silently drop the traffic families.

use bytes::Bytes;
use flate2::{Compress, Compression, FlushCompress, Status};

/// A gzip header: deflate, no name or time, unknown OS (RFC 1952, 2.3).
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// The front of a gzip body: its text deflated up to a full flush, and that text's checksum.
pub struct Deflated {
    blocks: Vec<u8>,
    crc: crc32fast::Hasher,
    len: u64,
}

/// Deflating failed: only a misuse of the compressor can make it, and the body is then sent
/// uncompressed.
#[derive(Debug, thiserror::Error)]
#[error("deflate: {0}")]
pub struct DeflateError(#[from] flate2::CompressError);

impl Deflated {
    pub fn new(text: &[u8]) -> Result<Self, DeflateError> {
        let blocks = deflate(text, FlushCompress::Full)?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(text);
        Ok(Deflated {
            blocks,
            crc,
            len: text.len() as u64,
        })
    }

    /// The whole gzip body: this front, then `rest`.
    pub fn finish(&self, rest: &[u8]) -> Result<Bytes, DeflateError> {
        let tail = deflate(rest, FlushCompress::Finish)?;
        let mut crc = self.crc.clone();
        crc.update(rest);
        let mut body = Vec::with_capacity(HEADER.len() + self.blocks.len() + tail.len() + 8);
        body.extend_from_slice(&HEADER);
        body.extend_from_slice(&self.blocks);
        body.extend_from_slice(&tail);
        body.extend_from_slice(&crc.finalize().to_le_bytes());
        // ISIZE is the length modulo 2^32 (RFC 1952, 2.3.1).
        body.extend_from_slice(&((self.len + rest.len() as u64) as u32).to_le_bytes());
        Ok(body.into())
    }
}

/// `input` as raw deflate blocks from a compressor of its own, ending with `flush`: `Full` leaves
/// the stream open at a byte boundary, `Finish` ends it.
fn deflate(input: &[u8], flush: FlushCompress) -> Result<Vec<u8>, DeflateError> {
    // The fastest level: the text is repetitive enough that it still shrinks about tenfold, and
    // a scrape's CPU is what is being saved.
    let mut compress = Compress::new(Compression::fast(), false);
    let mut out = Vec::with_capacity(input.len() / 8 + 1024);
    loop {
        if out.capacity() - out.len() < 1024 {
            out.reserve(out.capacity().max(4096));
        }
        let consumed = compress.total_in() as usize;
        let status = compress.compress_vec(&input[consumed..], &mut out, flush)?;
        let done = compress.total_in() as usize == input.len();
        match flush {
            FlushCompress::Finish if status == Status::StreamEnd => return Ok(out),
            // A flush is complete when it left room in the output (zlib's rule).
            FlushCompress::Finish => {}
            _ if done && out.len() < out.capacity() => return Ok(out),
            _ => {}
        }
    }
}

/// Whether an `Accept-Encoding` value admits gzip: `gzip`, `x-gzip` or `*`, without `q=0`
/// (RFC 9110, 12.5.3).
pub fn accepts_gzip(accept_encoding: &str) -> bool {
    accept_encoding.split(',').any(|item| {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or("").trim();
        let refused = parts.any(|p| {
            let p = p.trim();
            p.strip_prefix("q=")
                .or_else(|| p.strip_prefix("Q="))
                .and_then(|q| q.trim().parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        !refused
            && (coding.eq_ignore_ascii_case("gzip")
                || coding.eq_ignore_ascii_case("x-gzip")
                || coding == "*")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gunzip(body: &[u8]) -> Vec<u8> {
        // One member: `GzDecoder` reads the first member only, so a body of two would come back
        // short and fail the comparison.
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut text)
            .expect("a valid gzip body");
        text
    }

    #[test]
    fn a_kept_front_and_a_fresh_rest_make_one_gzip_member_of_the_whole_text() {
        let own: String = (0..5_000)
            .map(|i| format!("private_ingress_route_up{{host=\"h{i}.in.example.org\"}} 1\n"))
            .collect();
        let traffic: String = (0..3_000)
            .map(|i| format!("private_ingress_http_requests_total{{route=\"r{i}\"}} {i}\n"))
            .collect();
        let front = Deflated::new(own.as_bytes()).unwrap();
        for rest in ["", "x 1\n", traffic.as_str()] {
            let body = front.finish(rest.as_bytes()).unwrap();
            assert_eq!(gunzip(&body), format!("{own}{rest}").into_bytes());
            // And smaller: Prometheus text shrinks about tenfold.
            assert!(
                body.len() * 5 < own.len() + rest.len() + 200,
                "{}",
                body.len()
            );
        }
        let empty = Deflated::new(b"").unwrap();
        assert_eq!(gunzip(&empty.finish(b"").unwrap()), b"");
    }

    #[test]
    fn accept_encoding_is_read_as_http_says() {
        for yes in [
            "gzip",
            "deflate, gzip",
            "GZIP;q=0.5",
            "x-gzip",
            "*",
            "br, gzip;q=1.0",
        ] {
            assert!(accepts_gzip(yes), "{yes}");
        }
        for no in [
            "",
            "identity",
            "deflate, br",
            "gzip;q=0",
            "gzip; q=0.0",
            "gzipx",
        ] {
            assert!(!accepts_gzip(no), "{no}");
        }
    }
}
