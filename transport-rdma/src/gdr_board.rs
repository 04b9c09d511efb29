//! The GPUDirect board: the verdict one side of a pair writes into the
//! other's registered board page (`gdr.rs`): magic, yes/no, the inbox's
//! address, rkey and size, and the reason when it cannot.

/// Bytes of one board (a page): the peer's, then ours to send.
pub(crate) const BOARD_BYTES: usize = 4096;

const BOARD_MAGIC: u64 = 0x534e_434c_4744_5231; // "SNCLGDR1"
const BOARD_WORDS: usize = 6;

/// What one side publishes in the peer's board.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Board {
    /// Whether this side can use the device path.
    pub yes: bool,
    /// Its inbox: address, rkey, bytes (zero when `!yes`).
    pub inbox: (u64, u32, u64),
    /// Why not (empty when `yes`).
    pub reason: String,
}

impl Board {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let room = BOARD_BYTES - BOARD_WORDS * 8;
        let mut reason = self.reason.as_bytes();
        if reason.len() > room {
            reason = &reason[..room];
        }
        let words = [
            BOARD_MAGIC,
            u64::from(self.yes),
            self.inbox.0,
            u64::from(self.inbox.1),
            self.inbox.2,
            reason.len() as u64,
        ];
        let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.extend_from_slice(reason);
        out
    }

    pub(crate) fn decode(raw: &[u8]) -> Result<Board, String> {
        let word = |i: usize| {
            raw.get(i * 8..i * 8 + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        if word(0) != Some(BOARD_MAGIC) {
            return Err("the GPUDirect board does not start with its magic".into());
        }
        let yes = match word(1) {
            Some(0) => false,
            Some(1) => true,
            other => return Err(format!("the GPUDirect board's verdict is {other:?}")),
        };
        let (addr, rkey, bytes, n) = (word(2), word(3), word(4), word(5));
        let (Some(addr), Some(rkey), Some(bytes), Some(n)) = (addr, rkey, bytes, n) else {
            return Err("the GPUDirect board is short".into());
        };
        let rkey = u32::try_from(rkey)
            .map_err(|_| format!("the GPUDirect board's rkey {rkey:#x} is not 32 bits"))?;
        let start = BOARD_WORDS * 8;
        let reason = usize::try_from(n)
            .ok()
            .and_then(|n| raw.get(start..start.checked_add(n)?))
            .ok_or_else(|| format!("the GPUDirect board's reason of {n} bytes does not fit"))?;
        Ok(Board {
            yes,
            inbox: (addr, rkey, bytes),
            reason: String::from_utf8_lossy(reason).into_owned(),
        })
    }
}

/// Fuzz target (sncl-fuzz `gdr_board`): decodes bytes a peer wrote into
/// this side's board page; whatever decodes re-encodes to a board with the
/// same verdict and inbox. Never panics on any input.
#[doc(hidden)]
pub fn fuzz_gdr_board(data: &[u8]) {
    let mut raw = data.to_vec();
    // Let the magic through often enough to reach the fields.
    if data.first().is_some_and(|x| x & 1 == 0) && raw.len() >= 8 {
        raw[..8].copy_from_slice(&BOARD_MAGIC.to_le_bytes());
    }
    if let Ok(b) = Board::decode(&raw) {
        let again = Board::decode(&b.encode()).expect("an encoded board decodes");
        assert_eq!((again.yes, again.inbox), (b.yes, b.inbox));
    }
}

#[cfg(test)]
mod tests {
    use super::Board;

    #[test]
    fn boards_round_trip_and_bad_ones_are_refused() {
        let b = Board {
            yes: true,
            inbox: (0x4000_0000_0000_0000, 0x1234, 8 << 20),
            reason: String::new(),
        };
        assert_eq!(Board::decode(&b.encode()).unwrap(), b);
        let no = Board {
            yes: false,
            inbox: (0, 0, 0),
            reason: "SNCL_IB_GDR=0".into(),
        };
        let mut raw = no.encode();
        raw.resize(4096, 0);
        assert_eq!(Board::decode(&raw).unwrap(), no);
        assert!(Board::decode(&[0u8; 64]).is_err());
        let mut bad = b.encode();
        bad[8] = 7; // verdict neither 0 nor 1
        assert!(Board::decode(&bad).is_err());
        let mut long = b.encode();
        long[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Board::decode(&long).is_err());
        let huge = Board {
            reason: "x".repeat(10_000),
            ..no
        };
        assert!(huge.encode().len() <= 4096);
    }
}
