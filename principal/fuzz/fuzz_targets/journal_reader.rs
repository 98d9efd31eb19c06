//! Fuzzes the outbox journal reader ([`replay_bytes`], what `Outbox::open` replays after a
//! restart) on arbitrary file contents. Oracles: nothing panics; for well-framed records,
//! either every record is replayed or damage is reported (a reader that stops early without
//! saying why loses queued events silently).
//!
//! Raw bytes rarely get past a record's checksum, so an input starting with `F` is instead
//! cut into records framed with valid checksums (the journal's own layout,
//! `[kind u8][len u32 LE][sha256(payload)[..8]][payload]` after the header), which lets the
//! fuzzer reach the record decoding (events, confirmations) behind the checksums.
#![no_main]

use argocd_agent_proto::sync::journal::{replay_bytes, Record};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

const HEADER: &[u8] = b"ARGOQ1\n";

fuzz_target!(|data: &[u8]| {
    let Some((b'F', rest)) = data.split_first() else {
        let replay = replay_bytes(data);
        if data.is_empty() {
            assert!(replay.records.is_empty() && replay.damage.is_none());
        }
        return;
    };
    let (file, frames) = framed(rest);
    let replay = replay_bytes(&file);
    match &replay.damage {
        None => assert_eq!(replay.records.len(), frames, "records lost without damage"),
        Some(_) => assert!(
            replay.records.len() < frames,
            "damage reported on intact records"
        ),
    }
    for record in &replay.records {
        if let Record::Queued(ev) = record {
            let _ = ev.encode_to_vec();
        }
    }
});

/// The journal bytes of records cut from `rest`, and how many: each record is a kind byte, a
/// u16 LE length and that many payload bytes (whatever is left when it runs out).
fn framed(mut rest: &[u8]) -> (Vec<u8>, usize) {
    let mut out = HEADER.to_vec();
    let mut frames = 0;
    while let [kind, lo, hi, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(tail.len());
        let (payload, next) = tail.split_at(len);
        out.push(*kind);
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&Sha256::digest(payload)[..8]);
        out.extend_from_slice(payload);
        frames += 1;
        rest = next;
    }
    (out, frames)
}
