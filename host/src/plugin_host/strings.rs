//! Plugins pass strings as UTF-8, and only as UTF-8.
//!
//! The component model lets a component choose how its strings sit in
//! memory: UTF-8, UTF-16, or latin-1 mixed with UTF-16. wasmtime reads a
//! UTF-8 string in place, so the host sees its length before it copies a
//! byte; a string in either other encoding is transcoded into a new host
//! allocation first, up to three bytes for every two the plugin spent,
//! before any budget could look at it. So a component that declares any
//! other string encoding, anywhere in it, is refused at load: every string
//! a plugin can hand the host is then read in place and budgeted by its
//! raw length (see `lazy`).

use wasmparser::{CanonicalFunction, CanonicalOption, Parser, Payload};

/// The first non-UTF-8 string encoding the component declares, if any.
pub fn non_utf8_encoding(bytes: &[u8]) -> Result<Option<&'static str>, String> {
    for payload in Parser::new(0).parse_all(bytes) {
        let Payload::ComponentCanonicalSection(section) =
            payload.map_err(|e| e.message().to_string())?
        else {
            continue;
        };
        for function in section {
            let function = function.map_err(|e| e.message().to_string())?;
            for option in options(&function) {
                match option {
                    CanonicalOption::UTF16 => return Ok(Some("UTF-16")),
                    CanonicalOption::CompactUTF16 => return Ok(Some("latin-1/UTF-16")),
                    _ => {}
                }
            }
        }
    }
    Ok(None)
}

fn options(f: &CanonicalFunction) -> &[CanonicalOption] {
    match f {
        CanonicalFunction::Lift { options, .. }
        | CanonicalFunction::Lower { options, .. }
        | CanonicalFunction::TaskReturn { options, .. }
        | CanonicalFunction::StreamRead { options, .. }
        | CanonicalFunction::StreamWrite { options, .. }
        | CanonicalFunction::FutureRead { options, .. }
        | CanonicalFunction::FutureWrite { options, .. }
        | CanonicalFunction::ErrorContextNew { options, .. }
        | CanonicalFunction::ErrorContextDebugMessage { options, .. } => options,
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component whose only section lowers function 0 with the given
    /// string-encoding option byte (0x00 UTF-8, 0x01 UTF-16, 0x02 compact).
    pub(crate) fn component_lowering_with(encoding: u8) -> Vec<u8> {
        let mut c = b"\0asm\x0d\x00\x01\x00".to_vec();
        // canon section: 1 function: lower (0x01 0x00), func 0, 1 option.
        let body = [0x01, 0x01, 0x00, 0x00, 0x01, encoding];
        c.push(8);
        c.push(body.len() as u8);
        c.extend_from_slice(&body);
        c
    }

    #[test]
    fn only_utf8_passes() {
        assert_eq!(non_utf8_encoding(&component_lowering_with(0x00)), Ok(None));
        assert_eq!(
            non_utf8_encoding(&component_lowering_with(0x01)),
            Ok(Some("UTF-16"))
        );
        assert_eq!(
            non_utf8_encoding(&component_lowering_with(0x02)),
            Ok(Some("latin-1/UTF-16"))
        );
    }
}
