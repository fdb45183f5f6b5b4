//! Keys of a value stored in parts (see `sled_backend`): part `n` of the value at key `k` is
//! stored at `escape(k) ++ [0, 0] ++ n` (big-endian `u32`), where `escape` doubles every zero
//! byte as `[0, 0xFF]`. This is the tuple encoding of ordered key-value stores (as in
//! FoundationDB's): parts of one key are adjacent and in order, and the keys' order is kept,
//! whatever bytes or lengths the keys have (a key that is a prefix of another still sorts
//! first), so ranges and `last` over the logical keys are ranges and `last` over these.

/// Where the parts of `key` start: every one of them begins with it, nothing else does.
pub fn prefix(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 6);
    for &b in key {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0, 0]);
    out
}

/// Just past the last part of `key`: the parts of `key` are `prefix(key)..prefix_end(key)`.
pub fn prefix_end(key: &[u8]) -> Vec<u8> {
    let mut out = prefix(key);
    // The terminator [0, 0] becomes [0, 1]: after every part number, before any longer key.
    *out.last_mut().expect("a terminator") = 1;
    out
}

/// The stored key of part `n` of `key`.
pub fn part(key: &[u8], n: u32) -> Vec<u8> {
    let mut out = prefix(key);
    out.extend_from_slice(&n.to_be_bytes());
    out
}

/// The logical key and part number of a stored key; an error names what is wrong with one
/// this module did not make (a damaged database).
pub fn decode(stored: &[u8]) -> Result<(Vec<u8>, u32), String> {
    let mut key = Vec::with_capacity(stored.len());
    let mut i = 0;
    while i < stored.len() {
        match (stored[i], stored.get(i + 1)) {
            (0, Some(0xFF)) => key.push(0),
            (0, Some(0)) => {
                let rest: [u8; 4] =
                    stored[i + 2..].try_into().map_err(|_| format!("stored key {stored:?}: its part number is not 4 bytes"))?;
                return Ok((key, u32::from_be_bytes(rest)));
            }
            (0, _) => return Err(format!("stored key {stored:?}: a zero byte at {i} neither escaped nor ending the key")),
            (b, _) => key.push(b),
        }
        i += if stored[i] == 0 { 2 } else { 1 };
    }
    Err(format!("stored key {stored:?} has no part number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_decode_to_their_key_and_keep_the_keys_order() {
        let keys: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![0, 1],
            vec![0, 0xFF],
            vec![1],
            vec![1, 0],
            vec![1, 0, 0],
            b"vote".to_vec(),
            7u64.to_be_bytes().to_vec(),
        ];
        for k in &keys {
            for n in [0, 1, 255, 256, u32::MAX] {
                assert_eq!(decode(&part(k, n)), Ok((k.clone(), n)));
                assert!(part(k, n).starts_with(&prefix(k)) && part(k, n) < prefix_end(k));
            }
        }
        let mut sorted = keys.clone();
        sorted.sort();
        let mut stored: Vec<(Vec<u8>, Vec<u8>)> = keys.iter().flat_map(|k| [0, 1, 300].map(|n| (part(k, n), k.clone()))).collect();
        stored.sort();
        let mut in_stored_order: Vec<Vec<u8>> = stored.into_iter().map(|(_, k)| k).collect();
        in_stored_order.dedup();
        assert_eq!(in_stored_order, sorted, "the parts of each key are adjacent, and the keys in order");
        for (k, next) in sorted.iter().zip(&sorted[1..]) {
            assert!(prefix_end(k) <= part(next, 0), "{k:?} ends before {next:?} starts");
        }
    }

    #[test]
    fn keys_not_made_here_are_refused() {
        assert!(decode(b"abc").unwrap_err().contains("no part number"));
        assert!(decode(&[1, 0, 2]).unwrap_err().contains("neither escaped"));
        assert!(decode(&[1, 0, 0, 1]).unwrap_err().contains("not 4 bytes"));
    }
}
