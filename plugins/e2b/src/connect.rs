//! Connect's streaming framing: each message is one flag byte, a 32-bit
//! big-endian length, and that many bytes. Flag 0x02 marks the stream's
//! last message (its end, with an error or without); 0x01 a compressed one,
//! which this plugin never asks for and refuses.

/// Largest message accepted: a data event carries at most a read's worth of
/// output, far below this.
pub const MAX_MESSAGE: usize = 8 << 20;

pub const END_STREAM: u8 = 0x02;
const COMPRESSED: u8 = 0x01;

/// One message of a stream: its flags and body.
pub struct Message {
    pub flags: u8,
    pub body: Vec<u8>,
}

/// Frames `body` as one uncompressed message.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(0);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Collects bytes as they arrive and hands out whole messages.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message, if one has arrived.
    pub fn next(&mut self) -> Result<Option<Message>, String> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        if flags & COMPRESSED != 0 {
            return Err("a compressed message, which was not asked for".into());
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err("a message larger than 8 MiB".into());
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let body = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        Ok(Some(Message { flags, body }))
    }

    /// Bytes of a message not yet whole (a stream that ends here was cut).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}
